"""The server's side of the probes' zygote (probe_worker.py): one process that imports
xgrammar once and forks a compile probe in milliseconds whenever the pool needs one.

A probe that starts as an interpreter of its own needs xgrammar and torch imported first: 2-3
s on an idle machine, over 10 s on a loaded one. Every kill (a grammar past its budget, a
request that gave up) cost that again, and the requests behind it waited for it within their
own budgets. The zygote pays it once, at the server's start-up, beside the model's load.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import sys
import time
from typing import Any

logger = logging.getLogger(__name__)

WORKER_MODULE = "warmgate.server.serving.grammar.probe_worker"
CONTROL_MESSAGE_BYTES = 4096


class ProbeZygote:
    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._control: socket.socket | None = None
        self._setup: bytes | None = None
        self._setup_sent = False
        self._ready = False
        self._lock = asyncio.Lock()
        self._closed = False
        self._launched_s = 0.0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def launch(self) -> None:
        """Start the zygote (it imports xgrammar meanwhile); again if it died."""
        async with self._lock:
            await self._launch()

    async def _launch(self) -> None:
        if self._closed:
            raise OSError("the grammar compile probes are closed")
        if self._proc is not None and self._proc.returncode is None:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", WORKER_MODULE, "--control-fd", str(theirs.fileno()),
                stdin=asyncio.subprocess.PIPE, pass_fds=(theirs.fileno(),))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        if self._control is not None:
            self._control.close()
        self._control = ours
        self._ready = self._setup_sent = False
        self._launched_s = time.perf_counter()
        logger.info("grammar compile zygote %d started", self._proc.pid)
        await self._send_setup()

    async def set_up(self, tokenizer_info_json: str, max_threads: int) -> None:
        """The vocabulary every probe compiles against (sent once; again to a relaunch)."""
        async with self._lock:
            if self._setup is None:
                self._setup = (json.dumps({"tokenizer_info": tokenizer_info_json,
                                           "max_threads": max_threads}) + "\n").encode()
            await self._send_setup()

    async def _send_setup(self) -> None:
        proc = self._proc
        if proc is None or self._setup is None or self._setup_sent:
            return
        assert proc.stdin is not None  # PIPE
        self._setup_sent = True
        proc.stdin.write(self._setup)
        try:
            await proc.stdin.drain()
        except ConnectionError as exc:
            raise OSError(f"the grammar compile zygote {proc.pid} exited") from exc

    async def fork(self) -> tuple[int, socket.socket]:
        """A new probe: its pid and the socket it serves compiles on. OSError when the zygote
        cannot fork one (it is relaunched, with its import, at the next call)."""
        async with self._lock:
            await self._launch()
            if self._setup is None:
                raise OSError("the grammar compile probes have no vocabulary yet")
            control = self._control
            assert control is not None  # launched
            if not self._ready:
                await self._expect(control, "ready")
                self._ready = True
                logger.info("grammar compile zygote %s ready in %.2f s", self.pid,
                            time.perf_counter() - self._launched_s)
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                socket.send_fds(control, [json.dumps({"fork": True}).encode()],
                                [theirs.fileno()])
                pid = int((await self._expect(control, "pid"))["pid"])
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            return pid, ours

    async def _expect(self, control: socket.socket, key: str) -> dict[str, Any]:
        try:
            data = await asyncio.get_running_loop().sock_recv(control, CONTROL_MESSAGE_BYTES)
        except OSError as exc:
            data = b""
            logger.warning("the grammar compile zygote's socket failed: %s", exc)
        if not data:
            code = await self._proc.wait() if self._proc is not None else None
            raise OSError(f"the grammar compile zygote exited (exit code {code})")
        message: dict[str, Any] = json.loads(data)
        if key not in message:
            raise OSError(f"the grammar compile zygote said {message!r}, not {key!r}")
        return message

    def kill(self, pid: int) -> None:
        """SIGKILL a probe (the zygote checks it is still one of its own)."""
        control = self._control
        if control is None or self._closed:
            return
        # OSError: the zygote is gone, and its probes with it (PR_SET_PDEATHSIG).
        with contextlib.suppress(OSError):
            control.send(json.dumps({"kill": pid}).encode())

    def close(self) -> None:
        """Kill the zygote; its probes die with it (PR_SET_PDEATHSIG)."""
        self._closed = True
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()
        if self._control is not None:
            self._control.close()
            self._control = None

    async def wait_closed(self, timeout_s: float) -> None:
        if self._proc is not None:
            await asyncio.wait([asyncio.ensure_future(self._proc.wait())], timeout=timeout_s)
