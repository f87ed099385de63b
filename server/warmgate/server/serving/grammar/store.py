"""The compiled grammars of the process that serves them: a byte-bounded cache, and builds on
a few daemon threads, one build per spec at a time.

Used by the server's own grammar requests when the serving loop runs in its process, and by
the engine process when it runs there (control/engine_grammars.py): either way the grammar
was first compiled in a killable probe (probe_pool.py), which showed that it compiles within
the budget and how large it is. A build is one C++ call Python cannot interrupt, so it runs
on a thread nobody joins (the process exits without it on SIGTERM), never on a thread that
also reads commands or serves the event loop.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

import xgrammar as xgr

from warmgate.server.serving.grammar.backend import GrammarBackend
from warmgate.server.serving.grammar.byte_cache import ByteBoundedCache, trim_heap
from warmgate.server.serving.grammar.spec import GrammarSpec

logger = logging.getLogger(__name__)

MIB = 1 << 20
# Told once the build ends: the compiled grammar, or the exception the build raised.
BuildDone = Callable[["xgr.CompiledGrammar | None", "BaseException | None"], None]


class GrammarStore:
    def __init__(self, backend_of: Callable[[], GrammarBackend], cache_bytes: int,
                 max_builds: int) -> None:
        """backend_of: the model's backend, called on a build thread (the first call may scan
        the whole vocabulary); max_builds: builds running at once, the others queue."""
        self._backend_of = backend_of
        self.cache: ByteBoundedCache[GrammarSpec, xgr.CompiledGrammar] = \
            ByteBoundedCache(cache_bytes)
        self._max_builds = max_builds
        self._lock = threading.Lock()
        self._waiting: dict[GrammarSpec, list[BuildDone]] = {}
        self._queue: queue.SimpleQueue[tuple[GrammarSpec, int]] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self.num_running = 0
        self.num_builds = 0

    def get(self, spec: GrammarSpec, memory_bytes: int, done: BuildDone) -> None:
        """`done` with the compiled grammar: at once (on this thread) when it is cached, else
        from a build thread once it is built (one build for every caller waiting on the
        spec). memory_bytes: its size as the probe measured it, made room for first."""
        hit = self.cache.get(spec)
        if hit is not None:
            done(hit, None)
            return
        with self._lock:
            waiting = self._waiting.get(spec)
            if waiting is not None:
                waiting.append(done)
                return
            self._waiting[spec] = [done]
            if len(self._threads) < self._max_builds:
                thread = threading.Thread(target=self._work, name="grammar-build", daemon=True)
                self._threads.append(thread)
                thread.start()
        self._queue.put((spec, memory_bytes))

    def _work(self) -> None:
        while True:
            spec, memory_bytes = self._queue.get()
            with self._lock:
                self.num_running += 1
            start = time.perf_counter()
            logger.info("grammar build started: %s, %d chars, %.1f MiB by its probe",
                        spec.kind, len(spec.text), memory_bytes / MIB)
            compiled: xgr.CompiledGrammar | None = None
            error: BaseException | None = None
            try:
                if self.cache.make_room(memory_bytes):
                    trim_heap()
                compiled = self._backend_of().compile(spec)
            except BaseException as exc:  # handed to whoever waits for it
                error = exc
            if compiled is not None:
                cached = self.cache.put(spec, compiled, compiled.memory_size_bytes)
                logger.info("grammar built: %s, %d chars, %.3f s, %.1f MiB; cache %d grammars, "
                            "%.1f of %.1f MiB%s", spec.kind, len(spec.text),
                            time.perf_counter() - start, compiled.memory_size_bytes / MIB,
                            len(self.cache), self.cache.num_bytes / MIB,
                            self.cache.budget_bytes / MIB,
                            "" if cached else " (not cached: over the budget alone)")
            with self._lock:
                self.num_running -= 1
                self.num_builds += 1
                waiting = self._waiting.pop(spec, [])
            for done in waiting:
                try:
                    done(compiled, error)
                except Exception:  # one waiter's trouble must not stop the others or this thread
                    logger.exception("handing a built grammar over failed")
