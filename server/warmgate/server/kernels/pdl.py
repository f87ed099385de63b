"""Programmatic dependent launch (PDL, `--pdl`) for the decode step's Triton kernels: the one
switch every converted launch site reads, and the two device-side calls those kernels make.

A decode step is a few hundred short launches, each preceded by a gap of launch latency (about
3 us on an H100: bench/results/h100-step-kernels-llama-3.1-8b.txt). On sm_90+ a kernel
launched with the programmatic-serialization attribute (Triton's `launch_pdl=True`) may start
while the kernel before it in the stream is still finishing; it must then execute
`griddepcontrol.wait` (`pdl_wait`) before it reads anything an earlier kernel wrote or writes
anything an earlier kernel may still read. The wait returns once the previous grid has
completed and its memory is visible, and since that grid waited on its own predecessor the
same way, on every earlier kernel too. `pdl_release` lets the next grid launch before this
one ends; it never makes the next grid's reads early, the next grid's own wait does not
return before this grid completes.

The rule the launch sites keep: a kernel passed `launch_pdl=True` takes `USE_PDL=True` and
calls `pdl_wait` first (only loads of weights, which no kernel writes, may come before it);
`launch_args` gives both together or neither. A kernel not converted is launched as before
and waits for the whole previous kernel, which is always correct.

The switch is per process and set by the runner at construction from its configuration
(runner.default_ops.configure_pdl): the engine process and every tensor-parallel worker
build their own runner. Nothing here reads the environment. Launches on CPU tensors (the
Triton interpreter, TRITON_INTERPRET=1) never take it: the interpreter cannot run the PTX.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

import torch
import triton
import triton.language as tl

# The kernels that take USE_PDL, by the wrapper that launches them (the start-up log names
# them; every other Triton kernel is launched without PDL).
PDL_KERNELS: Final = (
    "dense_gemv/silu_mul_gemv (_gemv_kernel, _sum_splits_kernel)", "rms_norm",
    "rope_and_cache", "paged_attention_decode (_decode_kernel, merge_splits_kernel)",
    "silu_and_mul", "moe_gemv (_gate_up_kernel, _down_kernel)", "route_topk", "router_top_k")

_ON: Final[Mapping[str, bool]] = MappingProxyType({"USE_PDL": True, "launch_pdl": True})
_OFF: Final[Mapping[str, bool]] = MappingProxyType({"USE_PDL": False})


class _Switch:
    enabled = False


_SWITCH = _Switch()


def set_pdl(enabled: bool) -> None:
    """Turn PDL on or off for every later launch of a converted kernel in this process."""
    _SWITCH.enabled = enabled


def pdl_enabled() -> bool:
    return _SWITCH.enabled


def runs_compiled(t: torch.Tensor) -> bool:
    """Whether a kernel over `t` runs as a GPU binary; a CPU tensor means the interpreter."""
    return t.is_cuda


def launch_args(t: torch.Tensor) -> Mapping[str, bool]:
    """The launch keywords of a converted kernel whose tensors live where `t` does:
    USE_PDL=True with launch_pdl=True when the switch is on and the kernel runs compiled,
    else USE_PDL=False alone (the launch is the ordinary one). Spread them into the launch."""
    return _ON if _SWITCH.enabled and runs_compiled(t) else _OFF


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    """With USE_PDL: block until the previous grid in the stream has completed and its
    writes are visible. Before any load of what an earlier kernel wrote and any store."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def pdl_release(USE_PDL: tl.constexpr):
    """With USE_PDL: the next grid may launch once every program of this one has passed here
    (or exited). All of this grid's programs are resident by then, so the early grid takes
    only room this one no longer asks for, and it reads nothing before its own pdl_wait."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
