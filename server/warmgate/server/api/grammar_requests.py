"""The Generate service's side of structured output: the request's matcher from the model's
grammar compiles (serving/grammar/compiles.py), their errors as the statuses a client acts
on, and the compiles' start (before ready) and stop (on SIGTERM)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from warmgate.server.config.serving_config import ServingConfig
from warmgate.server.core.errors import (
    FieldViolation,
    InvalidArgument,
    ResourceExhausted,
    ShuttingDown,
)
from warmgate.server.serving.grammar.spec import (
    GrammarDeadEnd,
    GrammarError,
    GrammarSpec,
    GrammarTimeout,
    grammar_unavailable_reason,
)
from warmgate.server.text.model_text import ModelText

if TYPE_CHECKING:  # xgrammar loads with the first grammar request (or the warmup)
    from warmgate.server.control.engine_client import EngineProcess
    from warmgate.server.serving.grammar.backend import GrammarBackend
    from warmgate.server.serving.grammar.compiles import GrammarCompiles
    from warmgate.server.serving.grammar.matcher import RequestGrammar
    from warmgate.server.serving.grammar.probe_zygote import ProbeZygote

logger = logging.getLogger(__name__)
MIB = 1 << 20


def grammar_stream_error(error: BaseException) -> BaseException:
    """A step's grammar exception as what the stream ends with: a dead end is the request's
    grammar's fault (INVALID_ARGUMENT naming its field), anything else stays as it is."""
    if isinstance(error, GrammarDeadEnd):
        return InvalidArgument(FieldViolation(error.field, error.message))
    return error


class GrammarRequests:
    def __init__(self, text: ModelText, vocab_size: int, config: ServingConfig,
                 on_compile: Callable[[str, float], None] | None = None,
                 engine_process: EngineProcess | None = None) -> None:
        """engine_process: the engine that serves, which then builds and holds the grammars
        (None: this process serves and builds them)."""
        self._text = text
        self._vocab_size = vocab_size
        self._config = config
        self._on_compile = on_compile
        self._engine_process = engine_process
        self._compiles: GrammarCompiles | None = None
        self._zygote: ProbeZygote | None = None
        self._launching: asyncio.Future[None] | None = None
        self._closed = False

    def launch_probes_early(self) -> None:
        """Start the compile probes' zygote now, on the running loop: its import of xgrammar
        (seconds) then overlaps the model's load and warmup instead of the first grammar
        requests' budgets."""
        if grammar_unavailable_reason(self._text) is not None or self._zygote is not None:
            return
        from warmgate.server.serving.grammar.probe_zygote import ProbeZygote

        self._zygote = ProbeZygote()
        self._launching = asyncio.ensure_future(self._launch(self._zygote))

    @staticmethod
    async def _launch(zygote: ProbeZygote) -> None:
        try:
            await zygote.launch()
        except OSError:  # the first grammar request tries again, and says why
            logger.exception("could not start the grammar compile zygote")

    def _compiles_of(self, backend: GrammarBackend) -> GrammarCompiles:
        from warmgate.server.serving.grammar.compiles import (
            CompileLimits,
            GrammarBuilds,
            GrammarCompiles,
        )

        if self._compiles is None:
            c = self._config
            builds: GrammarBuilds
            if self._engine_process is not None:
                from warmgate.server.control.remote_grammars import RemoteBuilds

                builds = RemoteBuilds(self._engine_process)
            else:
                from warmgate.server.serving.grammar.local_builds import LocalBuilds

                builds = LocalBuilds(backend, c.grammar_cache_mib * MIB, c.grammar_max_compiles)
            self._compiles = GrammarCompiles(
                backend.tokenizer_info.serialize_json(), backend.compile_threads,
                CompileLimits(c.grammar_compile_timeout_s, c.grammar_max_compiles,
                              c.grammar_cache_mib * MIB), builds, self._on_compile,
                self._zygote)
        return self._compiles

    def prepare(self) -> None:
        """Start the compile probes before ready, if the warmup built the model's backend
        (without it, the first grammar request builds both)."""
        if grammar_unavailable_reason(self._text) is not None:
            return  # no backend to find, and its module's import of xgrammar took a second
        from warmgate.server.serving.grammar.backend import built_backend

        backend = built_backend(self._text, self._vocab_size)
        if backend is not None and not self._closed:
            self._compiles_of(backend).start()

    def build_backend_early(self) -> None:
        """Build this process's backend on a thread now: with an engine process the
        warmup's structured phase builds the engine's, not this one, which the first grammar
        request would otherwise pay for (a scan of the whole vocabulary)."""
        if grammar_unavailable_reason(self._text) is not None:
            return

        def build() -> None:
            from warmgate.server.serving.grammar.backend import grammar_backend

            try:
                grammar_backend(self._text, self._vocab_size)
            except Exception:  # the first grammar request builds it again, and says why
                logger.exception("building the grammar backend beside the warmup failed")

        threading.Thread(target=build, name="grammar-backend", daemon=True).start()

    async def ready(self, spec: GrammarSpec, req_id: str) -> RequestGrammar | None:
        """The request's grammar, ready to serve: its matcher, or None where the engine
        process holds it for `req_id` (release() it if the request is not submitted after
        all). INVALID_ARGUMENT naming the field when the grammar does not compile or cannot
        be enforced, RESOURCE_EXHAUSTED past the compile budget."""
        from warmgate.server.serving.grammar.backend import grammar_backend  # loads xgrammar

        if self._closed:
            raise ShuttingDown()
        # Built by the warmup's structured phase; only without warmup does this build it.
        backend = await asyncio.to_thread(grammar_backend, self._text, self._vocab_size)
        spec = dataclasses.replace(spec, json_whitespace=self._config.grammar_json_whitespace)
        try:
            return await self._compiles_of(backend).prepare(spec, req_id)
        except GrammarError as exc:
            raise InvalidArgument(FieldViolation(exc.field, exc.message)) from None
        except GrammarTimeout as exc:
            raise ResourceExhausted(str(exc)) from None

    def release(self, req_id: str) -> None:
        """A request whose grammar ready() returned is not submitted after all."""
        if self._compiles is not None:
            self._compiles.builds.release(req_id)

    @property
    def probes_idle(self) -> int:
        """Compile probes started and waiting for a grammar (0 before the first started)."""
        return self._compiles.pool.num_idle if self._compiles is not None else 0

    @property
    def num_compiles_running(self) -> int:
        """Grammar builds still on this process's threads (a stop does not wait for them)."""
        return self._compiles.builds.num_running if self._compiles is not None else 0

    async def close(self) -> None:
        """Kill the compile probes (requests waiting on them end UNAVAILABLE) and reap them."""
        self._closed = True
        if self._compiles is not None:
            self._compiles.close()
            await self._compiles.wait_closed()
        elif self._zygote is not None:
            if self._launching is not None:
                await self._launching
            self._zygote.close()
            await self._zygote.wait_closed(2.0)
