"""Triton's cache key of itself, computed on a background thread while the model loads.

Every kernel Triton compiles or loads from its on-disk cache is looked up under a key that
starts with `triton.runtime.cache.triton_key()`: a SHA-256 of Triton's own sources and of
libtriton.so (hundreds of MB). It is computed once per process (lru_cache), by the first
kernel, so a warm start's first Triton kernel paid for it even with every kernel already in
the cache (bench/results has the figure). Hashing and file reads release the GIL (hashlib does for
buffers over 2 KiB), so a thread started before the weights load computes it beside them.

The key's function also imports every package under triton.compiler, triton.backends and
triton.language (pkgutil.walk_packages does, to list their modules). Those imports run here,
on the caller's thread, before the thread starts: the thread then only reads and hashes files,
and never holds an import lock that the loading thread could wait on (or deadlock against).
What the key is does not change: the thread calls Triton's own function, whose cached result
every later compile uses; a failure leaves it for the first compile to compute, as before.
"""

from __future__ import annotations

import logging
import os
import pkgutil
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

# The packages triton_key walks (triton/runtime/cache.py, triton 3.6 and 3.9).
_WALKED = (("compiler", "triton.compiler."), ("backends", "triton.backends."),
           ("language", "triton.language."))


def _cached_key_function() -> Any:
    """triton.runtime.cache.triton_key where it is lru-cached (else warming it is useless)."""
    try:
        from triton.runtime import cache
    except ImportError:
        return None
    key = getattr(cache, "triton_key", None)
    return key if key is not None and hasattr(key, "cache_info") else None


def _import_walked_packages(triton_path: str) -> None:
    for sub, prefix in _WALKED:
        for _ in pkgutil.walk_packages([os.path.join(triton_path, sub)], prefix=prefix):
            pass


def start_triton_key() -> threading.Thread | None:
    """Start computing triton_key() in a daemon thread; None where there is nothing to warm
    (no triton, a triton without the cached function, or the key already computed)."""
    key = _cached_key_function()
    if key is None or key.cache_info().currsize:
        return None
    import triton

    start = time.perf_counter()
    try:
        _import_walked_packages(os.path.dirname(os.path.abspath(triton.__file__)))
    except Exception as exc:  # the first compile walks them again and reports what fails
        logger.info("triton key: not computed ahead (%s: %s)", type(exc).__name__, exc)
        return None
    imported = time.perf_counter() - start

    def run() -> None:
        begun = time.perf_counter()
        try:
            key()
        except Exception as exc:  # the first compile computes it again and raises it there
            logger.info("triton key: computing it ahead failed (%s: %s); the first kernel "
                        "will", type(exc).__name__, exc)
            return
        logger.info("triton key: computed in %.3f s in the background (its packages imported "
                    "in %.3f s before)", time.perf_counter() - begun, imported)

    thread = threading.Thread(target=run, name="warmgate-triton-key", daemon=True)
    thread.start()
    return thread
