"""The parent's end of the health process (api/health_process.py): start it, push statuses,
send heartbeats, count the calls it reports, and end it.

main.py starts it before the model server's heavy work, so `--health-port` answers
NOT_SERVING within the pod's first second; create_server starts one itself when none is
handed in (tests, benches that build a server in-process).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, cast

from warmgate.server.api.health import LIVENESS_SERVICE, READINESS_SERVICES
from warmgate.server.api.port_check import PortInUse, check_ports
from warmgate.server.config.flags import startup_error
from warmgate.server.config.listen_address import grpc_address
from warmgate.server.config.server_config import (
    HEALTH_PORT_DISABLED,
    MAX_HEALTH_WATCHERS,
    build_parser,
)
from warmgate.server.core import health_wire as wire

logger = logging.getLogger(__name__)

CHILD_MODULE = "warmgate.server.api.health_process"
# The folder warmgate.server is imported from here, so the child runs the same code.
SOURCE_ROOT = str(Path(__file__).resolve().parents[3])
OnCount = Callable[[str, str, int], None]


class HealthPortError(OSError):
    """The health process could not bind --health-port (the message names flag and address)."""


class HealthLink:
    """A running health process. set() and beat() may be called from any thread."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket, port: int,
                 reply: BinaryIO) -> None:
        self.proc, self.port = proc, port
        self._sock = sock
        self._lock = threading.Lock()
        self._closed = False
        self._broken = False
        self.on_count: OnCount | None = None
        self._reader = threading.Thread(target=self._read, args=(reply,), name="health-link",
                                        daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, host: str, port: int, statuses: Mapping[str, int], *, liveness: str,
              heartbeat_timeout_s: float = wire.HEARTBEAT_TIMEOUT_S,
              timeout_s: float = wire.START_TIMEOUT_S,
              max_watchers: int = MAX_HEALTH_WATCHERS) -> HealthLink:
        """Start the child and wait for its bind report; HealthPortError if it could not."""
        return PendingHealthLink(host, port, statuses, liveness=liveness,
                                 heartbeat_timeout_s=heartbeat_timeout_s,
                                 timeout_s=timeout_s, max_watchers=max_watchers).confirm()

    def _send(self, data: bytes) -> None:
        with self._lock:
            if self._closed or self._broken:
                return
            try:
                self._sock.sendall(data)
            except OSError as exc:
                self._broken = True
                logger.error("health process: cannot reach it (%s); --health-port is gone", exc)

    def set(self, service: str, status: int) -> None:
        self._send(wire.encode(wire.SET, service, status))

    def beat(self) -> None:
        self._send(wire.BEAT_LINE)

    async def heartbeat(self) -> None:
        """A heartbeat each interval for as long as the event loop runs it."""
        while not self._closed:
            self.beat()
            await asyncio.sleep(wire.HEARTBEAT_INTERVAL_S)

    def _read(self, reply: BinaryIO) -> None:
        for line in reply:
            message = wire.decode(line)
            if message[0] == wire.COUNT and self.on_count is not None:
                self.on_count(str(message[1]), str(message[2]), int(message[3]))
        if not self._closed:
            logger.error("health process %d exited (code %s): --health-port is gone",
                         self.proc.pid, self.proc.wait())

    def close(self, timeout_s: float = 5.0) -> None:
        """End the child (end of file on its socket) and reap it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            with contextlib.suppress(OSError):  # the child went first
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class PendingHealthLink:
    """A health process started whose bind report is not read yet: the parent goes on with
    its own start-up (torch's import, the CUDA context) while the child imports grpc and
    binds, and confirm() then waits for what is left of that."""

    def __init__(self, host: str, port: int, statuses: Mapping[str, int], *, liveness: str,
                 heartbeat_timeout_s: float = wire.HEARTBEAT_TIMEOUT_S,
                 timeout_s: float = wire.START_TIMEOUT_S,
                 max_watchers: int = MAX_HEALTH_WATCHERS) -> None:
        self._address = grpc_address(host, port)
        self._timeout_s = timeout_s
        self._ours, theirs = socket.socketpair()
        spec = {"host": host, "port": port, "address": self._address,
                "statuses": dict(statuses), "liveness": liveness,
                "heartbeat_timeout_s": heartbeat_timeout_s, "max_watchers": max_watchers,
                "parent": os.getpid()}
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [SOURCE_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])}
        with theirs:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", CHILD_MODULE, json.dumps(spec), str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env)

    def confirm(self) -> HealthLink:
        """The running link once the child reports its port; HealthPortError if it could
        not bind (or said nothing within the start timeout)."""
        ours, proc, timeout_s = self._ours, self._proc, self._timeout_s
        ours.settimeout(timeout_s)
        reply = cast(BinaryIO, ours.makefile("rb"))
        try:
            line = reply.readline()
        except OSError as exc:  # the timeout
            line, error = b"", f"no answer from the health process in {timeout_s:g} s ({exc})"
        else:
            error = f"the health process exited (code {proc.poll()})"
        message = wire.decode(line) if line else [
            wire.ERROR, f"argument --health-port: cannot serve {self._address}: {error}"]
        if message[0] != wire.BOUND:
            proc.kill()
            proc.wait()
            ours.close()
            raise HealthPortError(str(message[1]))
        ours.settimeout(None)
        return HealthLink(proc, ours, int(message[1]), reply)


def spawn_health_process(host: str, port: int, max_watchers: int) -> PendingHealthLink:
    """The health process for --health-port: readiness NOT_SERVING and liveness SERVING until
    the server pushes its own."""
    statuses = {**{name: wire.NOT_SERVING for name in READINESS_SERVICES},
                LIVENESS_SERVICE: wire.SERVING}
    return PendingHealthLink(host, port, statuses, liveness=LIVENESS_SERVICE,
                             max_watchers=max_watchers)


def start_health_link(host: str, port: int, max_watchers: int) -> HealthLink:
    """spawn_health_process, waiting for its bind report."""
    return spawn_health_process(host, port, max_watchers).confirm()


def start_health_link_early(argv: Sequence[str], environ: Mapping[str, str]
                            ) -> PendingHealthLink | None:
    """warmgate-server's first step: the flags parsed (no start-up check yet: those import
    torch and probe the device, seconds), every configured port checked as main checks them,
    and the health process started, so probes answer NOT_SERVING within the pod's first
    second; confirm_health_link waits for its bind report later. None without --health-port
    (or with --warmup-only); a bad flag or a busy port exits 2 with one line, as the full
    start-up would."""
    args = build_parser(environ).parse_args(argv)
    if args.warmup_only or args.health_port == HEALTH_PORT_DISABLED:
        return None
    try:
        check_ports(args.host, (("--port", args.port), ("--health-port", args.health_port),
                                ("--metrics-port", args.metrics_port)))
    except PortInUse as exc:
        startup_error(str(exc))
    return spawn_health_process(args.host, args.health_port, args.max_health_watchers)


def confirm_health_link(pending: PendingHealthLink | None) -> HealthLink | None:
    """The early health process's link once it bound; one line and exit 2 if it could not."""
    if pending is None:
        return None
    try:
        return pending.confirm()
    except HealthPortError as exc:
        startup_error(str(exc))
