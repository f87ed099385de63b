"""Triton: count true compiles, not kernels loaded from Triton's on-disk cache.

`knobs.runtime.jit_cache_hook` runs before and `jit_post_compile_hook` after every in-process
kernel-cache miss of a @triton.jit function (triton 3.6 and 3.9). Both fire for a real compile
and for a load from the on-disk cache alike, so this observer lists the cache directory at the
first hook and again at the second: a new entry means the compiler ran and wrote its output
(a miss); none means the binary came from the cache (a hit). The interpreter
(TRITON_INTERPRET=1) runs neither hook. A custom or remote cache manager
(TRITON_CACHE_MANAGER, TRITON_REMOTE_CACHE_BACKEND) writes elsewhere and would make every
compile look like a load.

Each hook is a single global slot, not a chain: the previous hook is kept and called, and its
return value is passed on (a truthy jit_cache_hook result tells Triton to skip compiling).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from warmgate.server.jit.events import TRITON
from warmgate.server.jit.monitor import JitMonitor

logger = logging.getLogger(__name__)


def _entries(directory: str) -> set[str]:
    try:
        return set(os.listdir(directory))
    except OSError:  # not created until the first compile writes to it
        return set()


def _default_cache_dir(knobs: Any) -> str:
    """knobs.cache.dir (it follows TRITON_CACHE_DIR), or Triton's documented default."""
    configured = getattr(getattr(knobs, "cache", None), "dir", None)
    if configured:
        return str(configured)
    return os.environ.get("TRITON_CACHE_DIR") or os.path.expanduser("~/.triton/cache")


class TritonObserver:
    name = TRITON
    after_weights = False

    def __init__(self, cache_dir: str | None = None) -> None:
        self._cache_dir = cache_dir
        self._monitor: JitMonitor | None = None
        self._prev_cache: Any = None
        self._prev_post: Any = None
        self._local = threading.local()
        # Bound once: a fresh bound method per attribute access would never compare `is`.
        self._cache_hook = self._on_cache
        self._post_hook = self._on_post

    def install(self, monitor: JitMonitor) -> bool:
        try:
            from triton import knobs
        except ImportError:
            return False
        runtime = knobs.runtime
        if not (hasattr(runtime, "jit_cache_hook") and hasattr(runtime, "jit_post_compile_hook")):
            logger.warning("this triton has no jit_cache_hook/jit_post_compile_hook; Triton "
                           "compiles are not counted")
            return False
        if self._cache_dir is None:
            self._cache_dir = _default_cache_dir(knobs)
        self._prev_cache, self._prev_post = runtime.jit_cache_hook, runtime.jit_post_compile_hook
        runtime.jit_cache_hook = self._cache_hook
        runtime.jit_post_compile_hook = self._post_hook
        self._monitor = monitor
        return True

    def uninstall(self) -> None:
        from triton import knobs

        runtime = knobs.runtime
        # Restore only what is still ours; a hook installed after us keeps calling ours,
        # which then only passes through.
        if runtime.jit_cache_hook is self._cache_hook:
            runtime.jit_cache_hook = self._prev_cache
        if runtime.jit_post_compile_hook is self._post_hook:
            runtime.jit_post_compile_hook = self._prev_post
        self._monitor = None

    def rearm(self) -> None:
        """Triton never clears its hooks itself."""

    def _on_cache(self, **kwargs: Any) -> Any:
        if self._monitor is not None and self._cache_dir is not None:
            self._local.start = (time.perf_counter(), _entries(self._cache_dir))
        return self._prev_cache(**kwargs) if self._prev_cache is not None else None

    def _on_post(self, **kwargs: Any) -> Any:
        result = self._prev_post(**kwargs) if self._prev_post is not None else None
        monitor, start = self._monitor, getattr(self._local, "start", None)
        self._local.start = None
        if monitor is None or self._cache_dir is None:
            return result
        if start is None:  # no baseline (async compile): count it as a compile, to be safe
            seconds, compiled = 0.0, True
        else:
            seconds = time.perf_counter() - start[0]
            compiled = bool(_entries(self._cache_dir) - start[1])
        fn = kwargs.get("fn")
        name = str(getattr(fn, "name", None) or kwargs.get("key", "kernel"))
        monitor.record(TRITON, name=name, compiled=compiled, seconds=seconds)
        return result
