"""Attention backends, chosen by name through a registry with lazy imports.

`import flashinfer` (or triton) never runs unless that backend is asked for.
"""

from __future__ import annotations

import importlib
import importlib.util

from warmgate.server.runner.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
)

# name -> (module, class, the import that must succeed for the backend to be usable)
_BACKENDS: dict[str, tuple[str, str, str]] = {
    "torch": ("warmgate.server.runner.attention.torch_backend", "TorchAttentionBackend", "torch"),
    "triton": ("warmgate.server.runner.attention.triton_backend", "TritonAttentionBackend",
               "triton"),
    "flashinfer": ("warmgate.server.runner.attention.flashinfer_backend",
                   "FlashInferAttentionBackend", "flashinfer"),
}


def backend_names() -> list[str]:
    return list(_BACKENDS)


def backend_available(name: str) -> bool:
    """Whether the backend's library can be imported here (without importing it)."""
    if name not in _BACKENDS:
        return False
    return importlib.util.find_spec(_BACKENDS[name][2]) is not None


def get_backend_class(name: str) -> type[AttentionBackend]:
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {backend_names()}")
    module_name, class_name, _ = _BACKENDS[name]
    module = importlib.import_module(module_name)
    cls: type[AttentionBackend] = getattr(module, class_name)
    return cls


def create_backend(name: str, spec: AttentionSpec) -> AttentionBackend:
    return get_backend_class(name)(spec)


__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "AttentionSpec",
    "backend_available",
    "backend_names",
    "create_backend",
    "get_backend_class",
]
