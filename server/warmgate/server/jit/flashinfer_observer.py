"""FlashInfer: count JIT module builds, and modules loaded from its JIT cache or AOT build.

FlashInfer (0.6.x) builds and loads every JIT module through
`flashinfer.jit.core.JitSpec.build_and_load`: ninja rebuilds `<jit dir>/<name>/<name>.so`
when it is missing or stale, then the module is loaded; an AOT module is loaded from the
wheel. The wrapper installed here compares the .so's mtime before and after: a new or
rewritten file is a build (a miss), an unchanged one a cache load (a hit). Without flashinfer
installed, or with a flashinfer that has no such method, the observer installs nothing.
On the GPU machine it saw the two modules built cold and loaded warm
(bench/results/h200-cache-cold-report.json, h200-cache-warm-report.json); kernels FlashInfer
fetches as prebuilt cubins are not seen.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import time
from pathlib import Path
from typing import Any

from warmgate.server.jit.events import FLASHINFER
from warmgate.server.jit.monitor import JitMonitor

logger = logging.getLogger(__name__)


def _mtime(path: Any) -> int | None:
    try:
        return Path(path).stat().st_mtime_ns if path is not None else None
    except OSError:
        return None


class FlashInferObserver:
    name = FLASHINFER
    # Its install imports flashinfer, which the engine imports beside the weights' load.
    after_weights = True

    def __init__(self) -> None:
        self._monitor: JitMonitor | None = None
        self._spec_cls: Any = None
        self._original: Any = None

    def install(self, monitor: JitMonitor) -> bool:
        if importlib.util.find_spec("flashinfer") is None:
            return False
        try:
            from flashinfer.jit import core
        except Exception as exc:  # a broken install must not stop the server; say so
            logger.warning("flashinfer.jit did not import (%s); FlashInfer JIT builds are not "
                           "counted", exc)
            return False
        spec_cls = getattr(core, "JitSpec", None)
        original = getattr(spec_cls, "build_and_load", None)
        if original is None:
            logger.warning("flashinfer.jit.core.JitSpec.build_and_load not found; FlashInfer "
                           "JIT builds are not counted")
            return False
        observer = self

        @functools.wraps(original)
        def build_and_load(spec: Any, *args: Any, **kwargs: Any) -> Any:
            return observer._observe(original, spec, args, kwargs)

        spec_cls.build_and_load = build_and_load
        self._spec_cls, self._original, self._monitor = spec_cls, original, monitor
        return True

    def uninstall(self) -> None:
        if self._spec_cls is not None:
            self._spec_cls.build_and_load = self._original
        self._spec_cls = self._original = self._monitor = None

    def rearm(self) -> None:
        """The patched method stays patched."""

    def _observe(self, original: Any, spec: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
        aot = bool(getattr(spec, "is_aot", False))
        path = getattr(spec, "jit_library_path", None)
        before = _mtime(path)
        start = time.perf_counter()
        result = original(spec, *args, **kwargs)
        seconds = time.perf_counter() - start
        after = _mtime(path)
        monitor = self._monitor
        if monitor is not None:
            built = not aot and after is not None and after != before
            monitor.record(FLASHINFER, name=str(getattr(spec, "name", "module")),
                           compiled=built, seconds=seconds)
        return result
