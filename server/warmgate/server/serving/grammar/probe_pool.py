"""Compile probes: processes that compile a grammar first, under the time budget, and are
killed when they run past it, when every request waiting on them is cancelled, or when the
server stops.

Why a process. xgrammar's compile is one C++ call that Python cannot interrupt: a compile
abandoned on a thread keeps a core and its memory busy until it is done (132 s for a 12 KB
schema of patterned properties on SmolLM2's vocabulary), and the interpreter's exit joins
the thread, so SIGTERM waited 82 s. A process can be killed at once. Why the grammar is then
compiled again where it is served: the compiled grammar cannot come back cheaply (xgrammar
serializes it only as JSON: a 25 MB grammar becomes 915 MB of text, 91 s to write and 25 s
to read), so the probe answers only whether the grammar compiles within the budget (and how
large it is), and the serving side builds it knowing it takes about that long. The cost per
distinct grammar: its compile runs twice, plus a line of JSON each way. The probes are
forked by one zygote process (probe_zygote.py), which paid for importing xgrammar once: a
killed probe is replaced in milliseconds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass

from warmgate.server.serving.grammar.probe_zygote import ProbeZygote
from warmgate.server.serving.grammar.spec import GrammarSpec

logger = logging.getLogger(__name__)

# A grammar request is at most MAX_GRAMMAR_CHARS (100,000) characters, each at most 6 when
# JSON-escaped; asyncio's default line limit is 64 KiB.
LINE_LIMIT = 1 << 20


class ProbeTimeout(TimeoutError):
    """No verdict in time; `killed`: a probe was compiling it (and was killed), else none
    had started by then."""

    def __init__(self, message: str, *, killed: bool) -> None:
        super().__init__(message)
        self.killed = killed


@dataclass(frozen=True)
class ProbeVerdict:
    ok: bool
    seconds: float = 0.0
    memory_bytes: int = 0
    message: str = ""  # why not ok: the grammar's error, or how the probe died


class _Probe:
    def __init__(self, pid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 zygote: ProbeZygote) -> None:
        self.pid = pid
        self._reader = reader
        self._writer = writer
        self._zygote = zygote
        self.alive = True

    async def ready(self) -> bool:
        """Whether the forked probe said it is ready (False: it died first)."""
        if await self._reader.readline():
            return True
        self.alive = False
        return False

    async def ask(self, spec: GrammarSpec) -> ProbeVerdict:
        request = {"kind": spec.kind, "text": spec.text, "json_whitespace": spec.json_whitespace}
        self._writer.write((json.dumps(request) + "\n").encode())
        await self._writer.drain()
        line = await self._reader.readline()
        if not line:
            self.kill()
            return ProbeVerdict(False, message="the grammar compiler's process died on it")
        reply = json.loads(line)
        if reply["verdict"] == "ok":
            return ProbeVerdict(True, float(reply["seconds"]), int(reply["bytes"]))
        return ProbeVerdict(False, message=str(reply["message"]))

    def kill(self) -> None:
        if self.alive:
            self.alive = False
            self._zygote.kill(self.pid)
        self._writer.close()


class ProbePool:
    """Up to `size` probe processes; the caller runs at most `size` probes at once."""

    def __init__(self, zygote: ProbeZygote, size: int, tokenizer_info_json: str,
                 compile_threads: int) -> None:
        self._zygote = zygote
        self._size = size
        self._setup = (tokenizer_info_json, compile_threads)
        self._idle: list[_Probe] = []
        self._busy: set[_Probe] = set()
        self._starting: set[asyncio.Task[bool]] = set()
        self._closed = False
        self.num_started = 0
        self.num_killed = 0

    @property
    def pids(self) -> list[int]:
        """The probe processes alive (idle or compiling)."""
        return [p.pid for p in (*self._idle, *self._busy) if p.alive]

    def start(self) -> None:
        """Start processes up to the pool's size in the background."""
        missing = self._size - len(self._idle) - len(self._busy) - len(self._starting)
        for _ in range(max(0, missing)):
            task = asyncio.ensure_future(self._start_one())
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _start_one(self) -> bool:
        try:
            probe = await self._spawn()
        except OSError:
            logger.exception("could not start a grammar compile probe")
            return False
        if self._closed:
            probe.kill()
            return False
        self._idle.append(probe)
        return True

    async def _spawn(self) -> _Probe:
        start = time.perf_counter()
        await self._zygote.set_up(*self._setup)
        pid, conn = await self._zygote.fork()
        try:
            reader, writer = await asyncio.open_unix_connection(sock=conn, limit=LINE_LIMIT)
        except BaseException:
            conn.close()
            self._zygote.kill(pid)
            raise
        probe = _Probe(pid, reader, writer, self._zygote)
        try:
            if not await probe.ready():
                raise OSError(f"the grammar compile probe {pid} exited before it was ready")
        except BaseException:
            probe.kill()
            raise
        self.num_started += 1
        logger.info("grammar compile probe %d ready in %.2f s", pid, time.perf_counter() - start)
        return probe

    @property
    def num_idle(self) -> int:
        """Probe processes started and waiting for a grammar."""
        return sum(p.alive for p in self._idle)

    @property
    def num_busy(self) -> int:
        """Probe processes compiling a grammar now."""
        return len(self._busy)

    async def probe(self, spec: GrammarSpec, timeout_s: float) -> ProbeVerdict:
        """Compile `spec` in an idle probe process, waiting for one to start if none is.
        ProbeTimeout past `timeout_s` (the wait for a start included); OSError when no process
        can start.

        Taking the process and giving it back (or killing it) happen in this one coroutine,
        under one try: a probe taken is never left marked busy, whenever the caller's timeout
        or cancellation lands. (A probe taken here and compiled in a task cancelled before it
        first ran stayed busy for good: every later grammar then found none free.)"""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        probe = await self._take(deadline)
        ask: asyncio.Future[ProbeVerdict] | None = None
        try:
            ask = asyncio.ensure_future(probe.ask(spec))
            done, _ = await asyncio.wait({ask}, timeout=max(0.0, deadline - loop.time()))
            if not done:
                raise ProbeTimeout(f"the grammar did not compile within {timeout_s:.2f} s",
                                   killed=True)
            verdict = ask.result()
        except BaseException:
            self._busy.discard(probe)
            probe.kill()
            if ask is not None and not ask.done():
                ask.cancel()
            self.num_killed += 1
            logger.info("grammar compile probe %d killed mid-compile (%s, %d chars)",
                        probe.pid, spec.kind, len(spec.text))
            if not self._closed:
                self.start()
            raise
        self._busy.discard(probe)
        if probe.alive and not self._closed:
            self._idle.append(probe)
        elif not self._closed:
            self.start()  # it died on the grammar: replace it
        return verdict

    async def _take(self, deadline: float) -> _Probe:
        """An idle probe process, marked busy; ProbeTimeout when none is idle by `deadline`
        (loop time), OSError when none can start. No await between taking one and returning
        it, so a cancellation never lands while one is held here."""
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise OSError("the grammar compile probes are closed")
            while self._idle:
                probe = self._idle.pop()
                if probe.alive:
                    self._busy.add(probe)
                    return probe
            self.start()
            if not self._starting:
                raise OSError("no grammar compile probe is free to start")
            left = deadline - loop.time()
            if left <= 0:
                raise ProbeTimeout("no grammar compile probe started in time", killed=False)
            done, _ = await asyncio.wait(set(self._starting), timeout=left,
                                         return_when=asyncio.FIRST_COMPLETED)
            if done and not self._idle and not any(t.result() for t in done
                                                   if not t.cancelled()):
                raise OSError("a grammar compile probe failed to start (see the log)")

    def close(self) -> None:
        """Kill every probe now (shutdown: a compile in progress is not waited for)."""
        self._closed = True
        for task in self._starting:
            task.cancel()
        for probe in (*self._idle, *self._busy):
            probe.kill()
        self._idle.clear()
        self._zygote.close()

    async def wait_closed(self, timeout_s: float) -> None:
        """After close(): the zygote's exit collected (its probes die with it), for up to
        timeout_s."""
        await self._zygote.wait_closed(timeout_s)
