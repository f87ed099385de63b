"""The Generate service's grammar compiles: bounded end to end in time, in number and in cache
bytes.

- Budget: a request's grammar is ready to serve within `timeout_s` of the request asking for
  it, or the request fails (GrammarTimeout, RESOURCE_EXHAUSTED naming the field). Everything
  counts: the wait for a compile slot, for a probe process to start, the probe's compile and
  the build that serves. A grammar compiles twice (once in a probe process that can be
  killed, probe_pool.py says why; once where it is served, which takes about as long), so the
  probe is killed once it has used half of what is left: past that, the build after it could
  not finish in time either.
- Concurrency: at most `max_concurrent` probes at once, and as many builds (the builds' own
  threads, store.py). Only grammar requests wait for them: a plain request never touches
  these slots or threads.
- Sharing: a grammar whose probe said it compiles within the budget is remembered by spec
  (the verdicts, bounded by their text's bytes), so the next request for it skips the probe;
  compiled grammars are cached by spec within a byte budget where they are served; concurrent
  requests for the same spec wait on one probe. The probe is killed when the last request
  waiting on it goes; a build that started finishes (the probe bounded it) and lands in the
  cache for the next one.
- Where the build runs (`GrammarBuilds`): in this process when it runs the serving loop
  (local_builds.py), or in the engine process, which then holds the grammar for the request
  until its submit (control/remote_grammars.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from warmgate.server.core.errors import ShuttingDown, Unavailable
from warmgate.server.serving.grammar.byte_cache import ByteBoundedCache
from warmgate.server.serving.grammar.probe_pool import ProbePool, ProbeTimeout, ProbeVerdict
from warmgate.server.serving.grammar.probe_zygote import ProbeZygote
from warmgate.server.serving.grammar.spec import GrammarError, GrammarSpec, GrammarTimeout

if TYPE_CHECKING:
    from warmgate.server.serving.grammar.matcher import RequestGrammar

logger = logging.getLogger(__name__)

# The outcomes warmgate_grammar_compile_seconds is labelled by.
COMPILE_OUTCOMES = ("compiled", "invalid", "timeout", "cancelled")
MIB = 1 << 20
# The share of the time left that the probe may use: the build after it takes about as long.
PROBE_SHARE = 0.5
# Verdicts remembered, by the bytes of their grammars' text (a grammar is at most 100,000
# characters): thousands of typical schemas.
VERDICT_TEXT_BYTES = 16 * MIB


@dataclass(frozen=True)
class CompileLimits:
    timeout_s: float
    max_concurrent: int
    cache_bytes: int


class GrammarBuilds(Protocol):
    """Where a grammar the probe accepted is built to be served."""

    async def build(self, spec: GrammarSpec, memory_bytes: int, req_id: str | None
                    ) -> RequestGrammar | None:
        """Build (or find cached) `spec`. With `req_id`: the request's matcher, or None where
        the grammar is held for that request elsewhere (the engine process); without: only
        built and cached. memory_bytes: its size as the probe measured it."""
        ...

    def release(self, req_id: str) -> None:
        """The request will not be submitted: drop what was held for it."""

    @property
    def num_running(self) -> int:
        """Builds on this process's threads (a stop does not wait for them)."""
        ...

    def close(self) -> None:
        """Shutdown: requests still waiting for a build end UNAVAILABLE."""


@dataclass
class _Flight:
    task: asyncio.Future[ProbeVerdict]
    waiters: int = 0


class GrammarCompiles:
    def __init__(self, tokenizer_info_json: str, compile_threads: int, limits: CompileLimits,
                 builds: GrammarBuilds,
                 on_compile: Callable[[str, float], None] | None = None,
                 zygote: ProbeZygote | None = None) -> None:
        """zygote: the probes' (launched early, so that its import overlaps the server's
        start-up); None: one of its own, launched with the first probe."""
        self._limits = limits
        self._builds = builds
        self._on_compile = on_compile
        self._verdicts: ByteBoundedCache[GrammarSpec, ProbeVerdict] = \
            ByteBoundedCache(VERDICT_TEXT_BYTES)
        self._flights: dict[GrammarSpec, _Flight] = {}
        self._slots = asyncio.Semaphore(limits.max_concurrent)
        self._pool = ProbePool(zygote if zygote is not None else ProbeZygote(),
                               limits.max_concurrent, tokenizer_info_json, compile_threads)
        self._closed = False

    def start(self) -> None:
        """Start the probe processes now (before ready) rather than on the first grammar."""
        self._pool.start()

    def close(self) -> None:
        """Shutdown: kill the probes and end the waits for builds (their requests end
        UNAVAILABLE); builds on threads are daemon threads nobody joins."""
        self._closed = True
        self._pool.close()
        self._builds.close()

    async def wait_closed(self, timeout_s: float = 2.0) -> None:
        """After close(): the killed probe processes reaped."""
        await self._pool.wait_closed(timeout_s)

    @property
    def pool(self) -> ProbePool:
        return self._pool

    @property
    def builds(self) -> GrammarBuilds:
        return self._builds

    async def prepare(self, spec: GrammarSpec, req_id: str) -> RequestGrammar | None:
        """The request's grammar, ready to serve within the budget: its matcher, or None where
        the engine process holds it for `req_id` (see GrammarBuilds.build). GrammarError
        (INVALID_ARGUMENT) when the grammar does not compile, cannot be enforced, or no token
        can start it; GrammarTimeout past the budget."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._limits.timeout_s
        verdict = self._verdicts.get(spec)
        if verdict is None:
            verdict = await self._probed(spec, deadline)
        try:
            return await asyncio.wait_for(self._builds.build(spec, verdict.memory_bytes, req_id),
                                          max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:  # TimeoutError's alias from Python 3.11 on
            self._builds.release(req_id)
            raise self._timeout(spec, "while its grammar was built (the build goes on, for "
                                      "the next request)") from None
        except BaseException:
            self._builds.release(req_id)
            raise

    async def _probed(self, spec: GrammarSpec, deadline: float) -> ProbeVerdict:
        """The probe's verdict, the grammar then built once where it is served (one probe and
        build for every request waiting on the spec), by `deadline` (loop time)."""
        flight = self._flights.get(spec)
        if flight is None:
            flight = _Flight(asyncio.ensure_future(self._flight(spec, deadline)))
            self._flights[spec] = flight
            flight.task.add_done_callback(lambda _: self._flights.pop(spec, None))
        flight.waiters += 1
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(asyncio.shield(flight.task),
                                          max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:  # a later request's deadline, before the flight's
            raise GrammarTimeout(spec.field, self._limits.timeout_s) from None
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():
                flight.task.cancel()  # nobody waits any more: kill the probe

    async def _flight(self, spec: GrammarSpec, deadline: float) -> ProbeVerdict:
        """Probe, then build once (cached where it is served): the compile the metrics count."""
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        outcome = "cancelled"
        try:
            verdict = await self._probe(spec, deadline)
            if not verdict.ok:
                outcome = "invalid"
                raise GrammarError(spec.field, verdict.message)
            self._verdicts.put(spec, verdict, len(spec.text))
            try:
                await asyncio.wait_for(self._builds.build(spec, verdict.memory_bytes, None),
                                       max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                raise self._timeout(spec, "while it was built after its probe (the build "
                                          "goes on, for the next request)") from None
            outcome = "compiled"
            logger.info("grammar compiled: %s, %d chars; probe %.3f s, %.1f MiB; ready in "
                        "%.3f s", spec.kind, len(spec.text), verdict.seconds,
                        verdict.memory_bytes / MIB, time.perf_counter() - start)
            return verdict
        except GrammarTimeout:
            outcome = "timeout"
            raise
        finally:
            if self._on_compile is not None:
                self._on_compile(outcome, time.perf_counter() - start)

    async def _probe(self, spec: GrammarSpec, deadline: float) -> ProbeVerdict:
        """The probe's verdict by `deadline` (loop time), the probe itself given PROBE_SHARE
        of the time left once it holds a slot."""
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(self._slots.acquire(), max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            raise self._timeout(spec, "waiting for a compile slot (no probe ran)") from None
        try:
            if self._closed:
                raise ShuttingDown()
            allowed = max(0.0, deadline - loop.time()) * PROBE_SHARE
            try:
                verdict = await self._pool.probe(spec, allowed)
            except ProbeTimeout as exc:
                raise self._timeout(spec, f"its probe was killed after {allowed:.2f} s"
                                    if exc.killed else "waiting for a probe process to "
                                    "start (no probe ran)") from None
            except OSError as exc:  # the server's trouble, not the grammar's
                if self._closed:
                    raise ShuttingDown() from None
                raise Unavailable(f"{spec.field} cannot be compiled now: {exc}") from None
            if self._closed:  # its probe was killed by close(), not by the grammar
                raise ShuttingDown()
            return verdict
        finally:
            self._slots.release()

    def _timeout(self, spec: GrammarSpec, where: str) -> GrammarTimeout:
        """The request's error, logged with where its time ran out."""
        logger.warning("grammar compile past its %.1f s budget (%s, %d chars) %s",
                       self._limits.timeout_s, spec.kind, len(spec.text), where)
        return GrammarTimeout(spec.field, self._limits.timeout_s)
