"""Test-only fault injection: make a chosen warmup phase raise or stall, on demand.

Off unless `WARMGATE_FAULT_INJECT` is set (read once, by load_server_config) or a test hands
a FaultInjector (warmgate.server.control.faults) to PlanEngine. This module is the spec and
its parser; the injector that fires them lives with the engine it wraps. The spec is a
comma-separated list of `phase:kind`:

  oom          torch.OutOfMemoryError, as a failed CUDA allocation raises it
  compile      a kernel compilation error (named like triton's CompilationError)
  cuda_fatal   RuntimeError("CUDA error: an illegal memory access was encountered")
  delay=S      sleep S seconds, to hold a warmup open (shutdown and cancellation tests)
  jit          record a Triton compile in the runner's JIT monitor, as a kernel compiled in
               that phase would (a MixedWarmup after ready: a compile after ready, also in an
               engine process)

e.g. `WARMGATE_FAULT_INJECT=kernels.decode:oom` or `mixed:delay=2,kernels.sampler:compile`.
A fault fires at the first runner call of its phase in a run, so the plan's own bookkeeping
blames the right phase. Raising faults fire once, so a test can show that a retry recovers;
a delay or a jit fires in every run.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmgate.server.config.flags import ENV_PREFIX
from warmgate.server.core.phases import LOAD, RUNNER_CALL_PHASES

ENV_VAR = ENV_PREFIX + "FAULT_INJECT"
# "load" fires before the runner is built; the others through the runner's callbacks.
FAULT_PHASES = (LOAD, *RUNNER_CALL_PHASES)
RAISING_KINDS = ("oom", "compile", "cuda_fatal")
MAX_DELAY_S = 600.0


class CompilationError(RuntimeError):
    """Stands in for triton.compiler.errors.CompilationError (matched by class name)."""


@dataclass(frozen=True)
class Fault:
    phase: str
    kind: str  # one of RAISING_KINDS, "jit" or "delay"
    delay_s: float = 0.0

    def exception(self) -> Exception:
        if self.kind == "oom":
            import torch

            return torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (injected fault)")
        if self.kind == "compile":
            return CompilationError("at 12:4: incompatible types in the kernel (injected fault)")
        return RuntimeError("CUDA error: an illegal memory access was encountered "
                            "(injected fault)")


def parse_faults(spec: str) -> tuple[Fault, ...]:
    """`phase:kind[,phase:kind...]` -> faults; a ValueError says what is wrong."""
    faults = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        phase, sep, kind = item.partition(":")
        if not sep or phase not in FAULT_PHASES:
            raise ValueError(f"{item!r}: expected phase:kind with phase one of "
                             f"{', '.join(FAULT_PHASES)}")
        if kind.startswith("delay="):
            seconds = float(kind.removeprefix("delay="))
            if not 0 <= seconds <= MAX_DELAY_S:
                raise ValueError(f"{item!r}: delay must be in [0, {MAX_DELAY_S:.0f}] s")
            faults.append(Fault(phase, "delay", seconds))
        elif kind in RAISING_KINDS or kind == "jit":
            faults.append(Fault(phase, kind))
        else:
            raise ValueError(f"{item!r}: kind must be one of {', '.join(RAISING_KINDS)}, "
                             "jit or delay=SECONDS")
    return tuple(faults)
