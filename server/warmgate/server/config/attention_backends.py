"""Which attention backends exist, where each lives and the library it needs.

Configuration needs this without importing the runner: `--attention-backend` lists the names,
`resolve_runner_config` picks one for "auto", and the start-up checks refuse one whose library
is missing. The runner's registry (warmgate.server.runner.attention) imports the backend
classes from the module paths named here, so the table is the one list of backends.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class BackendEntry:
    module: str  # the module defining the backend class
    class_name: str
    library: str  # the import that must succeed for the backend to be usable
    # The head sizes its kernels are built for; None: any. FlashInfer's prefill kernels
    # static_assert 64, 128 or 256 (a head size of 16 fails its JIT, after a minute of nvcc).
    head_dims: tuple[int, ...] | None = None


ATTENTION_BACKENDS: dict[str, BackendEntry] = {
    "torch": BackendEntry("warmgate.server.runner.attention.torch_backend",
                          "TorchAttentionBackend", "torch"),
    "triton": BackendEntry("warmgate.server.runner.attention.triton_backend",
                           "TritonAttentionBackend", "triton"),
    "flashinfer": BackendEntry("warmgate.server.runner.attention.flashinfer_backend",
                               "FlashInferAttentionBackend", "flashinfer", (64, 128, 256)),
}


def backend_names() -> list[str]:
    return list(ATTENTION_BACKENDS)


def head_dim_problem(name: str, head_dim: int) -> str | None:
    """Why the backend cannot attend with heads of this size, or None when it can."""
    sizes = ATTENTION_BACKENDS[name].head_dims
    if sizes is None or head_dim in sizes:
        return None
    return (f"{name} supports head sizes {', '.join(map(str, sizes))}; this model's is "
            f"{head_dim}")


def backend_available(name: str) -> bool:
    """Whether the backend's library can be imported here (found, not imported: importing
    flashinfer or triton costs seconds)."""
    if name not in ATTENTION_BACKENDS:
        return False
    return importlib.util.find_spec(ATTENTION_BACKENDS[name].library) is not None
