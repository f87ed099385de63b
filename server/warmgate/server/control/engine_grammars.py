"""The engine process's grammars: built when the front asks, held for a request until its
submit takes them.

The front probes every grammar first (serving/grammar/compiles.py), then asks for a build
(GRAMMAR_BUILD, with the request's id to hold it for, or none only to cache it) and waits for
the answer (GRAMMAR_BUILT) within its budget before it submits; a request that gives up
first sends GRAMMAR_RELEASE. The reader thread only files these: builds run on the store's
own threads (serving/grammar/store.py), so a compile never holds up the submits, aborts or
end of file behind it, and the compiled grammars are cached within --grammar-cache-mib.

The vocabulary is the one the front loaded and checked at start-up (sent with the
configuration): nothing here reads the model directory again.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Protocol

from warmgate.server.config.serving_config import ServingConfig
from warmgate.server.control import engine_wire as wire
from warmgate.server.core.tracebacks import log_failure
from warmgate.server.text.model_text import ModelText

if TYPE_CHECKING:  # xgrammar loads with the first grammar
    import xgrammar as xgr

    from warmgate.server.serving.grammar.backend import GrammarBackend
    from warmgate.server.serving.grammar.matcher import RequestGrammar
    from warmgate.server.serving.grammar.spec import GrammarSpec
    from warmgate.server.serving.grammar.store import GrammarStore

logger = logging.getLogger(__name__)
MIB = 1 << 20


class Replies(Protocol):
    """The pipe back to the front (engine_host.ReplyChannel, which holds these builders)."""

    def send(self, *message: Any) -> None: ...


class EngineGrammars:
    def __init__(self, text: ModelText, vocab_size: int, serving: ServingConfig,
                 out: Replies) -> None:
        self._text = text
        self._vocab_size = vocab_size
        self._serving = serving
        self._out = out
        self._store: GrammarStore | None = None
        self._lock = threading.Lock()
        # Builds asked for and not answered yet (their keys), and grammars held for requests.
        self._wanted: set[str] = set()
        self._held: dict[str, tuple[xgr.CompiledGrammar, GrammarSpec]] = {}

    def _backend(self) -> GrammarBackend:
        from warmgate.server.serving.grammar.backend import grammar_backend

        return grammar_backend(self._text, self._vocab_size)

    def _store_now(self) -> GrammarStore:
        if self._store is None:
            from warmgate.server.serving.grammar.store import GrammarStore

            self._store = GrammarStore(self._backend, self._serving.grammar_cache_mib * MIB,
                                       self._serving.grammar_max_compiles)
        return self._store

    @property
    def store(self) -> GrammarStore | None:
        """The build threads and cache, once a grammar asked for them."""
        return self._store

    def build(self, key: str, spec: GrammarSpec, memory_bytes: int, hold: bool) -> None:
        """On the reader thread: file the build; GRAMMAR_BUILT answers it (from a build
        thread, or at once when the grammar is cached). hold: keep it for request `key`."""
        with self._lock:
            self._wanted.add(key)

        def done(compiled: xgr.CompiledGrammar | None, error: BaseException | None) -> None:
            with self._lock:
                if key not in self._wanted:  # released meanwhile: nobody waits for it
                    return
                self._wanted.discard(key)
                if compiled is not None and hold:
                    self._held[key] = (compiled, spec)
            self._out.send(wire.GRAMMAR_BUILT, (key, self._error_to_wire(key, error)))

        try:
            self._store_now().get(spec, memory_bytes, done)
        except Exception as exc:  # answered, not raised: the reader thread must read on
            done(None, exc)

    def _error_to_wire(self, key: str, error: BaseException | None) -> wire.ErrorWire | None:
        if error is None:
            return None
        from warmgate.server.serving.grammar.spec import GrammarError

        if not isinstance(error, GrammarError):  # a bug, not the grammar: its traceback, once
            log_failure(logger, error, "building the grammar of %s failed", key)
        return wire.error_to_wire(error)

    def release(self, key: str) -> None:
        with self._lock:
            self._wanted.discard(key)
            self._held.pop(key, None)

    def take(self, req_id: str) -> RequestGrammar:
        """The matcher of the grammar held for `req_id` (its submit)."""
        import xgrammar as xgr

        from warmgate.server.serving.grammar.matcher import RequestGrammar

        with self._lock:
            held = self._held.pop(req_id, None)
        if held is None:
            raise RuntimeError(f"{req_id} was submitted with a grammar the engine does not "
                               "hold (it was never built for it, or was released)")
        compiled, spec = held
        return RequestGrammar(xgr.GrammarMatcher(compiled), self._vocab_size, spec.field, spec)

    @property
    def num_held(self) -> int:
        with self._lock:
            return len(self._held)
