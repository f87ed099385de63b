"""Triton kernels compiled for an H100 (sm_90) on a machine without a GPU, for the probes
that read what the GPU would run (tests/pdl_ptx_probe.py, tests/decode_spill_probe.py,
tests/gemv_spill_probe.py, tests/varlen_spill_probe.py; tests/probe_run.py runs one).

A probe is a program run without TRITON_INTERPRET (the kernels must be defined for the GPU).
No CUDA driver is needed: a stand-in tells the launcher the target, Triton's jit_cache_hook
takes each kernel before it would compile or launch, and the probe compiles what it took.
The cubin comes from the ptxas Triton ships, so its resource usage (cuobjdump, also shipped)
is what the GPU would load.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime import driver

from warmgate.server.config.runner_config import ModelConfig, preset_names

HOPPER = GPUTarget("cuda", 90, 32)
Shape = TypeVar("Shape", bound=Hashable)


def under_interpreter() -> bool:
    """Whether TRITON_INTERPRET=1 defined the kernels for the interpreter, not the GPU; says so
    on stderr (a probe then exits 2)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    print("run without TRITON_INTERPRET: the kernels must be defined for the GPU",
          file=sys.stderr)
    return True


def presets_by_shape(shape: Callable[[ModelConfig], Shape | None]) -> dict[Shape, list[str]]:
    """Every preset's name under the shape `shape` gives its model (None leaves it out), so
    each distinct shape is compiled once; in preset order."""
    shapes: dict[Shape, list[str]] = {}
    for name in preset_names():
        key = shape(ModelConfig.from_preset(name))
        if key is not None:
            shapes.setdefault(key, []).append(name)
    return shapes


class _CompileOnlyDriver:
    """What JITFunction.run asks of the driver before it compiles."""

    def get_current_target(self) -> GPUTarget:
        return HOPPER

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def record_launches(launch: Callable[[], None]) -> list[tuple[Any, dict[str, Any]]]:
    """(JITFunction, its compile spec) of every kernel `launch` would launch; nothing runs."""
    driver.set_active(_CompileOnlyDriver())  # type: ignore[arg-type]
    recorded: list[tuple[Any, dict[str, Any]]] = []

    def take(*, fn: Any, compile: dict[str, Any], **_: Any) -> bool:
        recorded.append((fn.jit_function, compile))
        return True  # compiled by the probe instead; nothing launches

    knobs.runtime.jit_cache_hook = take
    launch()
    return recorded


def compile_for_hopper(fn: Any, spec: dict[str, Any], option_names: tuple[str, ...]) -> Any:
    """The CompiledKernel of one recorded launch, with the launch's own `option_names`.

    The probe's tensors are on the CPU, so a kernel with an UPCAST flag (kernels/_launch.py's
    upcast_dots: the interpreter's float32 products instead of tl.dot) was recorded with it
    on; the GPU runs it off, and that binary is the one compiled here."""
    options = launch_options(spec)
    constants = dict(spec["constants"])
    if "UPCAST" in fn.arg_names:
        constants[(fn.arg_names.index("UPCAST"),)] = False
    src = ASTSource(fn, spec["signature"], constants, spec["configs"][0])
    return triton.compile(src, target=HOPPER, options={k: options[k] for k in option_names})


def launch_options(spec: dict[str, Any]) -> dict[str, Any]:
    """A recorded launch's options by name (num_warps, num_stages, ...)."""
    options: dict[str, Any] = json.loads(spec["specialization_data"])["options"]
    return options


def constants(fn: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """A recorded launch's constexpr values by parameter name."""
    names = fn.arg_names
    return {names[key[0]]: value for key, value in spec["constants"].items()}


def resource_usage(cubin: bytes) -> dict[str, int]:
    """cuobjdump's resource usage of a one-kernel cubin: REG (registers a thread), STACK
    (bytes a thread spills to local memory), SHARED, ..."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    return {k: int(v) for k, v in re.findall(r"\b([A-Z]+):(\d+)", out)}
