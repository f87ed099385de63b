"""The Generate service's grammar compiles: bounded in time, in number and in cache bytes.

- Budget: a grammar not compiled within `timeout_s` (waiting for a compile slot included)
  fails its request (GrammarTimeout, RESOURCE_EXHAUSTED naming the field). The compile runs
  first in a probe process that is killed at the budget (probe_pool.py says why a process,
  and what it costs); one that finished within it is compiled again here, on a daemon thread,
  which takes about as long.
- Concurrency: at most `max_concurrent` compiles (probe and in-process build) at once. Only
  grammar requests wait for them: a plain request never touches these slots or threads.
- Sharing: compiled grammars are cached by spec within a byte budget (byte_cache.py), and
  concurrent requests for the same spec wait on one compile. The compile is cancelled (its
  probe killed) when the last request waiting on it goes; an in-process build that already
  started finishes (it is bounded by the budget) and lands in the cache for the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import xgrammar as xgr

from warmgate.server.core.errors import ShuttingDown, Unavailable
from warmgate.server.serving.grammar.backend import GrammarBackend
from warmgate.server.serving.grammar.byte_cache import ByteBoundedCache, trim_heap
from warmgate.server.serving.grammar.matcher import RequestGrammar
from warmgate.server.serving.grammar.probe_pool import ProbePool, ProbeVerdict
from warmgate.server.serving.grammar.spec import GrammarError, GrammarSpec, GrammarTimeout

logger = logging.getLogger(__name__)

# The outcomes warmgate_grammar_compile_seconds is labelled by.
COMPILE_OUTCOMES = ("compiled", "invalid", "timeout", "cancelled")
MIB = 1 << 20


@dataclass(frozen=True)
class CompileLimits:
    timeout_s: float
    max_concurrent: int
    cache_bytes: int


@dataclass
class _Flight:
    task: asyncio.Future[xgr.CompiledGrammar]
    waiters: int = 0


class GrammarCompiles:
    def __init__(self, backend: GrammarBackend, limits: CompileLimits,
                 on_compile: Callable[[str, float], None] | None = None) -> None:
        self._backend = backend
        self._limits = limits
        self._on_compile = on_compile
        self._cache: ByteBoundedCache[GrammarSpec, xgr.CompiledGrammar] = \
            ByteBoundedCache(limits.cache_bytes)
        self._flights: dict[GrammarSpec, _Flight] = {}
        self._slots = asyncio.Semaphore(limits.max_concurrent)
        self._pool = ProbePool(backend.tokenizer_info.serialize_json(), limits.max_concurrent,
                               backend.compile_threads)
        self.num_builds_running = 0
        self._closed = False

    def start(self) -> None:
        """Start the probe processes now (before ready) rather than on the first grammar."""
        self._pool.start()

    def close(self) -> None:
        """Shutdown: kill the probes (their requests end UNAVAILABLE); in-process builds are
        daemon threads nobody joins."""
        self._closed = True
        self._pool.close()

    async def wait_closed(self, timeout_s: float = 2.0) -> None:
        """After close(): the killed probe processes reaped."""
        await self._pool.wait_closed(timeout_s)

    @property
    def cache(self) -> ByteBoundedCache[GrammarSpec, xgr.CompiledGrammar]:
        return self._cache

    @property
    def pool(self) -> ProbePool:
        return self._pool

    async def matcher(self, spec: GrammarSpec) -> RequestGrammar:
        """A fresh matcher for one request. GrammarError (INVALID_ARGUMENT) when the grammar
        does not compile, cannot be enforced, or no token sequence can start it;
        GrammarTimeout past the budget."""
        grammar = RequestGrammar(xgr.GrammarMatcher(await self.compiled(spec)),
                                 self._backend.vocab_size, spec.field, spec)
        if grammar.is_dead_end():
            raise GrammarError(spec.field, f"no output can match the {spec.kind}: no token of "
                               "the model's vocabulary can start it")
        return grammar

    async def compiled(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        hit = self._cache.get(spec)
        if hit is not None:
            return hit
        flight = self._flights.get(spec)
        if flight is None:
            flight = _Flight(asyncio.ensure_future(self._compile(spec)))
            self._flights[spec] = flight
            flight.task.add_done_callback(lambda _: self._flights.pop(spec, None))
        flight.waiters += 1
        try:
            return await asyncio.shield(flight.task)
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():
                flight.task.cancel()  # nobody waits any more: kill the probe

    async def _compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        start = time.perf_counter()
        outcome = "cancelled"
        try:
            verdict = await self._probe(spec)
            if not verdict.ok:
                outcome = "invalid"
                raise GrammarError(spec.field, verdict.message)
            compiled = await asyncio.shield(self._build(spec, verdict.memory_bytes))
            outcome = "compiled"
            logger.info("grammar compiled: %s, %d chars; probe %.3f s, total %.3f s, %.1f MiB; "
                        "cache %d grammars, %.1f of %.1f MiB", spec.kind, len(spec.text),
                        verdict.seconds, time.perf_counter() - start,
                        compiled.memory_size_bytes / MIB, len(self._cache),
                        self._cache.num_bytes / MIB, self._cache.budget_bytes / MIB)
            return compiled
        except GrammarTimeout:
            outcome = "timeout"
            logger.warning("grammar compile past its %.1f s budget (%s, %d chars); its probe "
                           "was killed", self._limits.timeout_s, spec.kind, len(spec.text))
            raise
        finally:
            if self._on_compile is not None:
                self._on_compile(outcome, time.perf_counter() - start)

    async def _probe(self, spec: GrammarSpec) -> ProbeVerdict:
        """The probe's verdict within the budget (the wait for a slot included, a probe
        process's start not), holding a slot: released here unless the verdict is ok (the
        in-process build then holds it until it ends)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._limits.timeout_s
        try:
            await asyncio.wait_for(self._slots.acquire(), self._limits.timeout_s)
        except asyncio.TimeoutError:  # TimeoutError's alias from Python 3.11 on
            raise GrammarTimeout(spec.field, self._limits.timeout_s) from None
        try:
            if self._closed:
                raise ShuttingDown()
            started = loop.time()
            try:
                probe = await self._pool.take()
            except OSError as exc:  # the server's trouble, not the grammar's
                if self._closed:
                    raise ShuttingDown() from None
                raise Unavailable(f"{spec.field} cannot be compiled now: {exc}") from None
            deadline += loop.time() - started
            try:
                verdict = await asyncio.wait_for(self._pool.ask(probe, spec),
                                                 max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise GrammarTimeout(spec.field, self._limits.timeout_s) from None
            if self._closed:  # its probe was killed by close(), not by the grammar
                raise ShuttingDown()
        except BaseException:
            self._slots.release()
            raise
        if not verdict.ok:
            self._slots.release()
        return verdict

    def _build(self, spec: GrammarSpec, memory_bytes: int
               ) -> asyncio.Future[xgr.CompiledGrammar]:
        """Compile in-process on a daemon thread (the probe showed it fits the budget); the
        held slot is released and the result cached when it ends, whoever still waits.
        memory_bytes: the size the probe measured, made room for first, so that the cache
        and the grammar being built stay within the budget together."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[xgr.CompiledGrammar] = loop.create_future()
        self.num_builds_running += 1

        def finish(compiled: xgr.CompiledGrammar | None, error: BaseException | None) -> None:
            self.num_builds_running -= 1
            self._slots.release()
            if compiled is not None:
                if not self._cache.put(spec, compiled, compiled.memory_size_bytes):
                    logger.info("grammar of %.1f MiB not cached: over the %.1f MiB budget",
                                compiled.memory_size_bytes / MIB, self._cache.budget_bytes / MIB)
                done.set_result(compiled)
            else:
                done.set_exception(error or RuntimeError("no compiled grammar"))
                # Read here, so one whose requests all went is not reported as never read.
                done.exception()

        def work() -> None:
            if self._cache.make_room(memory_bytes):
                trim_heap()
            try:
                result, error = self._backend.compile(spec), None
            except BaseException as exc:  # handed to the waiting request
                result, error = None, exc
            # RuntimeError: the loop closed meanwhile, the server has stopped.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(finish, result, error)

        threading.Thread(target=work, name="grammar-compile", daemon=True).start()
        return done
