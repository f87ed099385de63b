"""Attention backends, chosen by name through a registry with lazy imports.

The names, modules and libraries are config.attention_backends' table; `import flashinfer`
(or triton) never runs unless that backend is asked for.
"""

from __future__ import annotations

import importlib
import logging

from warmgate.server.config.attention_backends import (
    ATTENTION_BACKENDS,
    backend_available,
    backend_names,
)
from warmgate.server.runner.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
)

logger = logging.getLogger(__name__)


def get_backend_class(name: str) -> type[AttentionBackend]:
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {backend_names()}")
    entry = ATTENTION_BACKENDS[name]
    module = importlib.import_module(entry.module)
    cls: type[AttentionBackend] = getattr(module, entry.class_name)
    return cls


def create_backend(name: str, spec: AttentionSpec) -> AttentionBackend:
    """The backend `name`; --deterministic routes flashinfer through our Triton kernels (its
    decode and prefill wrappers reduce in different orders, and split the KV by batch)."""
    if spec.deterministic and name == "flashinfer":
        logger.info("deterministic: flashinfer attention runs the Triton fixed-split kernel "
                    "(keys cut at fixed positions, folded in one order, for every query row)")
        name = "triton"
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
