"""GrammarBuilds where the engine process serves: the grammar is built there
(control/engine_grammars.py), and held for the request until its submit.

The front holds no compiled grammar of its own: it asks (GRAMMAR_BUILD) and waits for the
answer (GRAMMAR_BUILT, on the receiver thread) within the request's budget; a request that
stops waiting tells the engine to drop what it holds for it (GRAMMAR_RELEASE).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import TYPE_CHECKING, Any

from warmgate.server.control import engine_wire as wire
from warmgate.server.control.engine_client import EngineLost, EngineProcess
from warmgate.server.core.errors import ShuttingDown

if TYPE_CHECKING:
    from warmgate.server.serving.grammar.matcher import RequestGrammar
    from warmgate.server.serving.grammar.spec import GrammarSpec


class RemoteBuilds:
    def __init__(self, process: EngineProcess) -> None:
        self._process = process
        self._pending: dict[str, asyncio.Future[None]] = {}
        self._keys = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        process.handlers[wire.GRAMMAR_BUILT] = self._on_built

    async def build(self, spec: GrammarSpec, memory_bytes: int, req_id: str | None
                    ) -> RequestGrammar | None:
        """None: the engine holds the grammar for `req_id` (the request's submit says so)."""
        self._loop = asyncio.get_running_loop()
        key = req_id if req_id is not None else f"cache-{next(self._keys)}"
        built: asyncio.Future[None] = self._loop.create_future()
        self._pending[key] = built
        try:
            try:
                self._process.send(wire.GRAMMAR_BUILD, key, spec, memory_bytes,
                                   req_id is not None)
            except EngineLost:  # the loss takes the server down; this request ends now
                raise ShuttingDown() from None
            await built
        except BaseException:
            if req_id is not None:
                self.release(req_id)
            raise
        finally:
            self._pending.pop(key, None)
        return None

    def _on_built(self, answer: tuple[str, Any]) -> None:
        """On the receiver thread: a GRAMMAR_BUILT."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the server stopped
                loop.call_soon_threadsafe(self._settle, *answer)

    def _settle(self, key: str, error: wire.ErrorWire | None) -> None:
        built = self._pending.get(key)
        if built is None or built.done():  # the request went meanwhile
            return
        if error is None:
            built.set_result(None)
        else:
            built.set_exception(wire.error_of_wire(error))

    def release(self, req_id: str) -> None:
        with contextlib.suppress(EngineLost):  # a lost engine holds nothing any more
            self._process.send(wire.GRAMMAR_RELEASE, req_id)

    @property
    def num_running(self) -> int:
        return 0  # the engine's threads: it exits without them

    def close(self) -> None:
        for built in list(self._pending.values()):
            if not built.done():
                built.set_exception(ShuttingDown())
