"""One model's grammar backend: xgrammar's TokenizerInfo and compiler.

Built once per model directory and shared by the warmup (which builds it, so the vocabulary
scan is paid before ready) and the Generate service, whose compiles (bounded in time, number
and cache bytes) are compiles.py's. compile() here runs where it is called: the warmup's own
small grammars, and compiles.py's worker thread.
"""

from __future__ import annotations

import logging
import threading
import time
from importlib.metadata import version

import xgrammar as xgr

from warmgate.server.serving.grammar.front_end import compile_grammar
from warmgate.server.serving.grammar.matcher import RequestGrammar
from warmgate.server.serving.grammar.spec import GrammarSpec, grammar_unavailable_reason
from warmgate.server.serving.grammar.tokenizer_info import tokenizer_info_of
from warmgate.server.text.model_text import ModelText

logger = logging.getLogger(__name__)

# xgrammar's own compile threads per grammar (its default is 8; the event loop and the
# serving worker need the cores more).
COMPILE_THREADS = 2


class GrammarBackend:
    def __init__(self, info: xgr.TokenizerInfo, *, compile_threads: int = COMPILE_THREADS
                 ) -> None:
        self.tokenizer_info = info
        self.vocab_size = int(info.vocab_size)
        self.compile_threads = compile_threads
        # Compiled grammars are cached by compiles.py, within its byte budget; xgrammar's
        # cache would hold a second copy, unbounded by it.
        self._compiler = xgr.GrammarCompiler(info, max_threads=compile_threads,
                                             cache_enabled=False)
        self._lock = threading.Lock()
        self.num_compiles = 0

    def compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        """The compiled grammar; GrammarError with xgrammar's message when the text is not a
        valid grammar of its kind."""
        compiled = compile_grammar(self._compiler, spec)
        with self._lock:
            self.num_compiles += 1
        return compiled

    def matcher(self, spec: GrammarSpec) -> RequestGrammar:
        """A fresh matcher for one request, compiling on this thread."""
        return RequestGrammar(xgr.GrammarMatcher(self.compile(spec)), self.vocab_size,
                              spec.field, spec)


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


def built_backend(text: ModelText, vocab_size: int) -> GrammarBackend | None:
    """The model's backend if something (the warmup) already built it."""
    with _backends_lock:
        return _backends.get((text.directory, vocab_size))
