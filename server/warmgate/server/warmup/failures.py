"""Turn an exception raised inside a phase into a sentence that names the setting to change."""

from __future__ import annotations

# Settings to lower when a phase runs out of device memory, by phase.
_OOM_ADVICE = {
    "load": "lower --num-blocks (KV cache size), --max-model-len or --max-num-seqs, or pick a "
            "smaller --model",
    "cuda_graphs": "lower --max-num-seqs (the largest captured size) or pass "
                   "--no-cuda-graphs",
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
    if is_out_of_memory(exc):
        advice = _OOM_ADVICE.get(phase, _OOM_DEFAULT)
        return f"out of memory in phase {phase} ({kind}: {exc}); {advice}"
    if is_compile_error(exc):
        return (f"kernel compilation failed in phase {phase} ({kind}: {exc}); try "
                "--attention-backend torch, or --no-compile if torch.compile is on")
    return f"phase {phase} raised {kind}: {exc}"
