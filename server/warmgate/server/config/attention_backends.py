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


ATTENTION_BACKENDS: dict[str, BackendEntry] = {
    "torch": BackendEntry("warmgate.server.runner.attention.torch_backend",
                          "TorchAttentionBackend", "torch"),
    "triton": BackendEntry("warmgate.server.runner.attention.triton_backend",
                           "TritonAttentionBackend", "triton"),
    "flashinfer": BackendEntry("warmgate.server.runner.attention.flashinfer_backend",
                               "FlashInferAttentionBackend", "flashinfer"),
}


def backend_names() -> list[str]:
    return list(ATTENTION_BACKENDS)


def backend_available(name: str) -> bool:
    """Whether the backend's library can be imported here (found, not imported: importing
    flashinfer or triton costs seconds)."""
    if name not in ATTENTION_BACKENDS:
        return False
    return importlib.util.find_spec(ATTENTION_BACKENDS[name].library) is not None
