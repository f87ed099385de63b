"""GrammarBuilds where this process runs the serving loop: the grammar is built on this
process's build threads (store.py) and each request gets its own matcher of it."""

from __future__ import annotations

import asyncio
import contextlib

import xgrammar as xgr

from warmgate.server.core.errors import ShuttingDown
from warmgate.server.serving.grammar.backend import GrammarBackend
from warmgate.server.serving.grammar.matcher import RequestGrammar
from warmgate.server.serving.grammar.spec import GrammarSpec
from warmgate.server.serving.grammar.store import GrammarStore


class LocalBuilds:
    def __init__(self, backend: GrammarBackend, cache_bytes: int, max_builds: int) -> None:
        self._backend = backend
        self.store = GrammarStore(lambda: backend, cache_bytes, max_builds)
        self._waiting: set[asyncio.Future[xgr.CompiledGrammar]] = set()

    async def build(self, spec: GrammarSpec, memory_bytes: int, req_id: str | None
                    ) -> RequestGrammar | None:
        loop = asyncio.get_running_loop()
        built: asyncio.Future[xgr.CompiledGrammar] = loop.create_future()

        def settle(compiled: xgr.CompiledGrammar | None, error: BaseException | None) -> None:
            if built.done():  # the request went (or the server stopped) meanwhile
                return
            if compiled is not None:
                built.set_result(compiled)
            else:
                built.set_exception(error or RuntimeError("the grammar build gave nothing"))

        def done(compiled: xgr.CompiledGrammar | None, error: BaseException | None) -> None:
            # From a build thread, or this one on a cache hit.
            with contextlib.suppress(RuntimeError):  # the loop closed: the server stopped
                loop.call_soon_threadsafe(settle, compiled, error)

        self._waiting.add(built)
        try:
            self.store.get(spec, memory_bytes, done)
            compiled = await built
        finally:
            self._waiting.discard(built)
        if req_id is None:
            return None
        return RequestGrammar(xgr.GrammarMatcher(compiled), self._backend.vocab_size,
                              spec.field, spec)

    def release(self, req_id: str) -> None:
        """Nothing is held for a request here: its matcher goes with it."""

    @property
    def num_running(self) -> int:
        return self.store.num_running

    def close(self) -> None:
        for built in list(self._waiting):
            if not built.done():
                built.set_exception(ShuttingDown())
