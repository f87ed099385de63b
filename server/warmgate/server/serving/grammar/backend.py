"""One model's grammar backend: xgrammar's TokenizerInfo and compiler, and a bounded cache of
compiled grammars keyed by (kind, text).

Built once per model directory and shared by the warmup (which builds it, so the vocabulary
scan is paid before ready) and the Generate service. Compiling runs on a worker thread: a
large JSON schema takes xgrammar a while, and the event loop must keep answering health
probes and other streams meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from importlib.metadata import version

import xgrammar as xgr

from warmgate.server.serving.grammar.matcher import RequestGrammar
from warmgate.server.serving.grammar.spec import (
    GrammarError,
    GrammarSpec,
    grammar_unavailable_reason,
    one_line,
)
from warmgate.server.serving.grammar.tokenizer_info import tokenizer_info_of
from warmgate.server.text.model_text import ModelText

logger = logging.getLogger(__name__)

# Compiled grammars kept, least recently used dropped first: a client that sends a fresh
# schema with every request must not grow the server's memory without end.
MAX_CACHED_GRAMMARS = 256
# xgrammar's own compile threads per grammar (its default is 8; the event loop and the
# serving worker need the cores more).
COMPILE_THREADS = 2
# Whitespace characters allowed between two JSON elements (xgrammar's max_whitespace_cnt).
# Any whitespace is allowed, as vLLM allows it, since models write pretty-printed JSON; but
# unbounded, a model that keeps choosing whitespace inside an object never closes it and runs
# to max_tokens. 20 is a newline and nine levels of two-space indentation.
MAX_JSON_WHITESPACE = 20


class GrammarBackend:
    def __init__(self, info: xgr.TokenizerInfo, *,
                 max_cached: int = MAX_CACHED_GRAMMARS) -> None:
        self.tokenizer_info = info
        self.vocab_size = int(info.vocab_size)
        # Our cache holds whole compiled grammars by request text; xgrammar's would hold a
        # second copy keyed the same way.
        self._compiler = xgr.GrammarCompiler(info, max_threads=COMPILE_THREADS,
                                             cache_enabled=False)
        self._max_cached = max_cached
        self._cache: OrderedDict[GrammarSpec, xgr.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.num_compiles = 0

    def compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        """The compiled grammar (cached); GrammarError with xgrammar's message when the text
        is not a valid grammar of its kind."""
        with self._lock:
            hit = self._cache.get(spec)
            if hit is not None:
                self._cache.move_to_end(spec)
                return hit
        start = time.perf_counter()
        try:
            if spec.kind == "json_schema":
                compiled = self._compiler.compile_json_schema(
                    spec.text, max_whitespace_cnt=MAX_JSON_WHITESPACE)
            elif spec.kind == "regex":
                compiled = self._compiler.compile_regex(spec.text)
            else:
                compiled = self._compiler.compile_grammar(spec.text)
        except Exception as exc:  # xgrammar raises RuntimeError (C++) or ValueError
            raise GrammarError(spec.field, f"not a valid {spec.kind}: {one_line(exc)}") from None
        with self._lock:
            self.num_compiles += 1
            self._cache[spec] = compiled
            self._cache.move_to_end(spec)
            while len(self._cache) > self._max_cached:
                self._cache.popitem(last=False)
            cached = len(self._cache)
        logger.debug("grammar compiled: %s, %d chars in %.3f s; %d cached", spec.kind,
                     len(spec.text), time.perf_counter() - start, cached)
        return compiled

    async def compile_async(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        return await asyncio.to_thread(self.compile, spec)

    def matcher(self, spec: GrammarSpec) -> RequestGrammar:
        """A fresh matcher for one request (compiling on this thread if not cached)."""
        return RequestGrammar(xgr.GrammarMatcher(self.compile(spec)), self.vocab_size)

    async def matcher_async(self, spec: GrammarSpec) -> RequestGrammar:
        return await asyncio.to_thread(self.matcher, spec)

    @property
    def num_cached(self) -> int:
        with self._lock:
            return len(self._cache)


_backends: dict[tuple[str | None, int], GrammarBackend] = {}
_backends_lock = threading.Lock()


def grammar_backend(text: ModelText, vocab_size: int) -> GrammarBackend:
    """The model's backend, built on first use (a scan of the whole vocabulary) and shared
    after. ValueError when grammar_unavailable_reason says it cannot be built."""
    reason = grammar_unavailable_reason(text)
    if reason is not None:
        raise ValueError(reason)
    assert text.tokenizer is not None  # narrowed by the reason check
    key = (text.directory, vocab_size)
    with _backends_lock:
        backend = _backends.get(key)
        if backend is None:
            start = time.perf_counter()
            info = tokenizer_info_of(text.tokenizer.tokenizer, vocab_size, text.eos_token_ids)
            backend = GrammarBackend(info)
            _backends[key] = backend
            logger.info("structured output: xgrammar %s, %s vocabulary of %d, stop ids %s, "
                        "built in %.2f s", version("xgrammar"), info.vocab_type.name, vocab_size,
                        list(info.stop_token_ids), time.perf_counter() - start)
    return backend
