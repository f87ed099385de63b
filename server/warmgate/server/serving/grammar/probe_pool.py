"""Compile probes: child processes that compile a grammar first, under the time budget, and
are killed when they run past it, when every request waiting on them is cancelled, or when
the server stops.

Why a process. xgrammar's compile is one C++ call that Python cannot interrupt: a compile
abandoned on a thread keeps a core and its memory busy until it is done (132 s for a 12 KB
schema of patterned properties on SmolLM2's vocabulary), and the interpreter's exit joins
the thread, so SIGTERM waited 82 s. A process can be killed at once. Why the server then
compiles again itself: the compiled grammar cannot come back cheaply (xgrammar serializes
it only as JSON: a 25 MB grammar becomes 915 MB of text, 91 s to write and 25 s to read), so
the probe answers only whether the grammar compiles within the budget, and the server
compiles it in-process knowing it takes about that long. The cost per distinct grammar: its
compile runs twice (the cache makes it once per text), plus a line of JSON each way; per
probe process, an interpreter with xgrammar (and so torch) loaded: about 260 MiB RSS and 2-3
s to start, paid before ready (GenerationService.prepare) and again only after a kill.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from dataclasses import dataclass

from warmgate.server.serving.grammar.spec import GrammarSpec

logger = logging.getLogger(__name__)

WORKER_MODULE = "warmgate.server.serving.grammar.probe_worker"
# A grammar request is at most MAX_GRAMMAR_CHARS (100,000) characters, each at most 6 when
# JSON-escaped; asyncio's default line limit is 64 KiB.
LINE_LIMIT = 1 << 20


@dataclass(frozen=True)
class ProbeVerdict:
    ok: bool
    seconds: float = 0.0
    memory_bytes: int = 0
    message: str = ""  # why not ok: the grammar's error, or how the probe died


class _Probe:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def ask(self, spec: GrammarSpec) -> ProbeVerdict:
        assert self.proc.stdin is not None and self.proc.stdout is not None  # PIPEs
        request = {"kind": spec.kind, "text": spec.text, "json_whitespace": spec.json_whitespace}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        await self.proc.stdin.drain()
        line = await self.proc.stdout.readline()
        if not line:
            code = await self.proc.wait()
            return ProbeVerdict(False, message=f"the grammar compiler's process died on it "
                                               f"(exit code {code})")
        reply = json.loads(line)
        if reply["verdict"] == "ok":
            return ProbeVerdict(True, float(reply["seconds"]), int(reply["bytes"]))
        return ProbeVerdict(False, message=str(reply["message"]))

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


class ProbePool:
    """Up to `size` probe processes; the caller runs at most `size` probes at once."""

    def __init__(self, tokenizer_info_json: str, size: int, compile_threads: int) -> None:
        self._setup = (json.dumps({"tokenizer_info": tokenizer_info_json,
                                   "max_threads": compile_threads}) + "\n").encode()
        self._size = size
        self._idle: list[_Probe] = []
        self._busy: set[_Probe] = set()
        self._starting: set[asyncio.Task[bool]] = set()
        self._spawned: set[_Probe] = set()  # not reaped yet
        self._closed = False
        self.num_started = 0
        self.num_killed = 0

    @property
    def processes(self) -> list[asyncio.subprocess.Process]:
        """The probe processes started and not yet reaped (killed ones until they are)."""
        return [p.proc for p in self._spawned]

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
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", WORKER_MODULE, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, limit=LINE_LIMIT)
        probe = _Probe(proc)
        self._spawned.add(probe)
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(self._setup)
            await proc.stdin.drain()
            if not await proc.stdout.readline():
                raise OSError(f"the grammar compile probe exited with {await proc.wait()} "
                              "before it was ready")
        except BaseException:
            probe.kill()
            raise
        self.num_started += 1
        logger.info("grammar compile probe %d ready in %.2f s", proc.pid,
                    time.perf_counter() - start)
        return probe

    async def take(self) -> _Probe:
        """An idle probe process, waiting for one to start if none is (a start is not a
        compile: the caller's budget leaves it out). OSError when none can start."""
        while True:
            if self._closed:
                raise OSError("the grammar compile probes are closed")
            while self._idle:
                probe = self._idle.pop()
                if probe.proc.returncode is None:
                    self._busy.add(probe)
                    return probe
            self.start()
            if not self._starting:
                raise OSError("no grammar compile probe is free to start")
            done, _ = await asyncio.wait(set(self._starting),
                                         return_when=asyncio.FIRST_COMPLETED)
            if not self._idle and not any(t.result() for t in done if not t.cancelled()):
                raise OSError("a grammar compile probe failed to start (see the log)")

    async def ask(self, probe: _Probe, spec: GrammarSpec) -> ProbeVerdict:
        """Compile `spec` in `probe` (from take()) and give it back. Cancelled (the budget ran
        out, or nobody waits any more): the process is killed and a fresh one started in the
        background."""
        try:
            verdict = await probe.ask(spec)
        except BaseException:
            self._busy.discard(probe)
            probe.kill()
            self.num_killed += 1
            logger.info("grammar compile probe %d killed mid-compile (%s, %d chars)",
                        probe.proc.pid, spec.kind, len(spec.text))
            if not self._closed:
                self.start()
            raise
        self._busy.discard(probe)
        if probe.proc.returncode is None and not self._closed:
            self._idle.append(probe)
        elif not self._closed:
            self.start()  # it died on the grammar: replace it
        return verdict

    def close(self) -> None:
        """Kill every probe now (shutdown: a compile in progress is not waited for)."""
        self._closed = True
        for task in self._starting:
            task.cancel()
        for probe in self._spawned:
            probe.kill()
        self._idle.clear()

    async def wait_closed(self, timeout_s: float) -> None:
        """After close(): reap the killed processes (their pipes closed), for up to
        timeout_s."""
        probes, self._spawned = self._spawned, set()
        if probes:
            await asyncio.wait([asyncio.ensure_future(p.proc.wait()) for p in probes],
                               timeout=timeout_s)
