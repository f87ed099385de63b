"""Turn an exception raised inside a phase into a sentence that names the setting to change."""

from __future__ import annotations

from warmgate.server.core.phases import CUDA_GRAPHS, LOAD

# Settings to lower when a phase runs out of device memory, by phase.
_OOM_ADVICE = {
    LOAD: "lower --num-blocks (KV cache size), --max-model-len or --max-num-seqs, or pick a "
          "smaller --model",
    CUDA_GRAPHS: "lower --max-num-seqs (the largest captured size) or "
                 "--max-num-batched-tokens (the largest ragged-batch graph), or pass "
                 "--no-ragged-cuda-graphs or --no-cuda-graphs",
}
_OOM_DEFAULT = "lower --max-num-batched-tokens or --max-num-seqs, or --num-blocks"


def is_out_of_memory(exc: BaseException) -> bool:
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except ImportError:  # pragma: no cover - the server always has torch
        pass
    text = str(exc).lower()
    return "out of memory" in text or isinstance(exc, MemoryError)


def is_compile_error(exc: BaseException) -> bool:
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"CompilationError", "CompileTimeAssertionFailure", "BackendCompilerFailed",
                         "OutOfResources"})


def describe_failure(phase: str, exc: BaseException) -> str:
    kind = type(exc).__name__
    if is_fatal_device_error(exc):
        return describe_fatal(phase, exc.cause if isinstance(exc, FatalDeviceError) else exc)
    if is_out_of_memory(exc):
        advice = _OOM_ADVICE.get(phase, _OOM_DEFAULT)
        return f"out of memory in phase {phase} ({kind}: {exc}); {advice}"
    if is_compile_error(exc):
        return (f"kernel compilation failed in phase {phase} ({kind}: {exc}); try "
                "--attention-backend torch, or --no-compile if torch.compile is on")
    return f"phase {phase} raised {kind}: {exc}"


# Messages of CUDA errors that are sticky: once one happens, every later call in the process
# fails too, so the only recovery is a new process (a pod restart). OOM and compile errors are
# not on this list: they leave the context usable and a smaller setting can succeed.
_FATAL_CUDA_MESSAGES = (
    "an illegal memory access was encountered",
    "an illegal instruction was encountered",
    "device-side assert triggered",
    "unspecified launch failure",
    "misaligned address",
    "uncorrectable ecc error",
    "the launch timed out and was terminated",
    "hardware stack error",
)


class FatalDeviceError(RuntimeError):
    """A sticky CUDA error raised in `phase`: the process cannot recover and must exit."""

    def __init__(self, phase: str, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.phase = phase
        self.cause = cause


def is_fatal_device_error(exc: BaseException) -> bool:
    """The one place that decides fatal (restart the process) vs recoverable (report, retry).

    torch and triton raise CUDA errors as RuntimeError (torch.AcceleratorError) naming the
    driver's message; wrappers may chain them, so the causes are looked at too.
    """
    seen: BaseException | None = exc
    for _ in range(8):  # a bounded walk: a cause chain can in principle loop
        if seen is None:
            return False
        if isinstance(seen, FatalDeviceError):
            return True
        text = str(seen).lower()
        if "cuda" in text and any(m in text for m in _FATAL_CUDA_MESSAGES):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def describe_fatal(phase: str, exc: BaseException) -> str:
    return (f"fatal CUDA error in phase {phase} ({type(exc).__name__}: {exc}); the CUDA context "
            "is unusable, so the server exits with code 70 for Kubernetes to restart the pod")
