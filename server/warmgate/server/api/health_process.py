"""The health process: `--health-port` served by a child of warmgate-server, with its own GIL.

`python -m warmgate.server.api.health_process SPEC FD` (api/health_link.py starts it): SPEC
is JSON {"host", "port", "address", "statuses", "liveness", "heartbeat_timeout_s",
"max_watchers", "parent"}, FD its end of the socketpair (core/health_wire.py). It imports
grpc, grpc_health's messages, that module, grpc_options, port_check and stream_cap, nothing
else of ours, so it answers within a fraction of a second of its start, while the parent
still imports torch and loads the model; and a burst of probes never competes with the model
server's event loop.

- Check answers from a table of pre-serialized responses; Watch streams every change, at
  most max_watchers (--max-health-watchers) streams at once, more refused
  RESOURCE_EXHAUSTED; List answers the table. The parent pushes each status change
  (readiness, liveness, the drain).
- Liveness is honest: the parent's event loop sends a heartbeat a second; after
  heartbeat_timeout_s without one, the liveness service answers NOT_SERVING until they resume.
- The child ends with its parent: end of file on the socket (a short grace first, in which
  the Watch streams send the statuses it set last), or PR_SET_PDEATHSIG (a SIGKILLed
  parent whose socket a forked grandchild still holds). SIGTERM and SIGINT are ignored: the
  parent's drain keeps liveness SERVING until it exits, and so must this port.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from warmgate.server.api.grpc_options import SERVER_OPTIONS
from warmgate.server.api.port_check import PortInUse, check_port
from warmgate.server.core import health_wire as wire
from warmgate.server.core.stream_cap import StreamCap, health_watch_cap

SERVICE = "grpc.health.v1.Health"
PR_SET_PDEATHSIG = 1
FLUSH_S = 1.0  # call counts go to the parent in batches, this often
# Once its parent is gone, the child stops its server with this grace before it exits: time
# for the Watch streams to send the statuses the parent set last (its drain's NOT_SERVING).
STOP_GRACE_S = 0.25


class HealthTable:
    """The parent's statuses and the heartbeat's verdict; answers as pre-serialized bytes."""

    def __init__(self, statuses: dict[str, int], liveness: str, heartbeat_timeout_s: float
                 ) -> None:
        self._statuses = dict(statuses)
        self._liveness = liveness
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._last_beat: float | None = None  # the watchdog is armed by the first heartbeat
        self.stale = False
        self._bytes: dict[int, bytes] = {
            s: health_pb2.HealthCheckResponse(status=s).SerializeToString()
            for s in (wire.SERVING, wire.NOT_SERVING, wire.SERVICE_UNKNOWN)}
        self.answers: dict[str, bytes] = {}
        self._watchers: dict[str, set[asyncio.Queue[bytes]]] = collections.defaultdict(set)
        for name in self._statuses:
            self._refresh(name)

    def status(self, service: str) -> int | None:
        if service == self._liveness and self.stale:
            return wire.NOT_SERVING
        return self._statuses.get(service)

    def _answer(self, status: int | None) -> bytes:
        return self._bytes[status if status is not None else wire.SERVICE_UNKNOWN]

    def _refresh(self, service: str) -> None:
        status = self.status(service)
        answer = self._answer(status)
        if status is not None:
            self.answers[service] = answer
        for queue in self._watchers.get(service, ()):
            queue.put_nowait(answer)

    def set(self, service: str, status: int) -> None:
        self._statuses[service] = status
        self._refresh(service)

    def beat(self) -> None:
        self._last_beat = time.monotonic()
        if self.stale:
            self.stale = False
            print("warmgate health process: heartbeats resumed; liveness follows the server "
                  "again", file=sys.stderr, flush=True)
            self._refresh(self._liveness)

    def check_heartbeat(self) -> None:
        if self._last_beat is None or self.stale:
            return
        silent = time.monotonic() - self._last_beat
        if silent > self.heartbeat_timeout_s:
            self.stale = True
            print(f"warmgate health process: no heartbeat from the server's event loop for "
                  f"{silent:.1f} s; liveness NOT_SERVING", file=sys.stderr, flush=True)
            self._refresh(self._liveness)

    def list(self) -> bytes:
        data: bytes = health_pb2.HealthListResponse(statuses={
            name: health_pb2.HealthCheckResponse(status=self.status(name))
            for name in self._statuses}).SerializeToString()
        return data

    def watch(self, service: str) -> asyncio.Queue[bytes]:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._watchers[service].add(queue)
        queue.put_nowait(self._answer(self.status(service)))
        return queue

    def unwatch(self, service: str, queue: asyncio.Queue[bytes]) -> None:
        self._watchers[service].discard(queue)
        if not self._watchers[service]:
            del self._watchers[service]


def _service_of(data: bytes) -> str | None:
    try:
        service: str = health_pb2.HealthCheckRequest.FromString(data).service
        return service
    except Exception:  # DecodeError, or invalid UTF-8
        return None


def _log(level: int, message: str) -> None:
    # The parent's log is not this process's: its lines go to stderr, named.
    print(f"warmgate health process: {message}", file=sys.stderr, flush=True)


def handlers(table: HealthTable, counts: collections.Counter[tuple[str, str]],
             watchers: StreamCap) -> grpc.GenericRpcHandler:
    """Check, Watch and List on bytes: no (de)serializer runs but the request's parse."""
    check_name, watch_name, list_name = (f"/{SERVICE}/{m}" for m in ("Check", "Watch", "List"))

    async def check(data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        service = _service_of(data)
        answer = table.answers.get(service) if service is not None else None
        if answer is not None:
            counts[(check_name, "OK")] += 1
            return answer
        code = grpc.StatusCode.NOT_FOUND if service is not None else \
            grpc.StatusCode.INVALID_ARGUMENT
        counts[(check_name, code.name)] += 1
        await context.abort(code, "unknown service" if service is not None else
                            "not a valid grpc.health.v1.HealthCheckRequest")
        raise AssertionError("abort returned")  # abort raises

    async def watch(data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
                    ) -> AsyncIterator[bytes]:
        service = _service_of(data)
        if service is None:
            counts[(watch_name, "INVALID_ARGUMENT")] += 1
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "not a valid grpc.health.v1.HealthCheckRequest")
        assert service is not None
        refusal = watchers.take()
        if refusal is not None:
            counts[(watch_name, "RESOURCE_EXHAUSTED")] += 1
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
        queue, last = table.watch(service), b""
        try:
            while True:
                answer = await queue.get()
                if answer != last:
                    yield answer
                    last = answer
        finally:
            table.unwatch(service, queue)
            watchers.release()
            counts[(watch_name, "CANCELLED")] += 1  # a Watch ends only when its caller leaves

    async def list_(data: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        counts[(list_name, "OK")] += 1
        return table.list()

    return grpc.method_handlers_generic_handler(SERVICE, {
        "Check": grpc.unary_unary_rpc_method_handler(check),
        "Watch": grpc.unary_stream_rpc_method_handler(watch),
        "List": grpc.unary_unary_rpc_method_handler(list_)})


async def _follow_parent(reader: asyncio.StreamReader, table: HealthTable) -> None:
    """Apply the parent's heartbeats and statuses until its end of file."""
    while line := await reader.readline():
        message = wire.decode(line)
        if message[0] == wire.BEAT:
            table.beat()
        elif message[0] == wire.SET:
            table.set(str(message[1]), int(message[2]))


async def _every(seconds: float, fn: Any) -> None:
    while True:
        await asyncio.sleep(seconds)
        fn()


async def serve(spec: dict[str, Any], sock: Any) -> int:
    table = HealthTable({str(k): int(v) for k, v in spec["statuses"].items()},
                        str(spec["liveness"]), float(spec["heartbeat_timeout_s"]))
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    server = grpc.aio.server(options=SERVER_OPTIONS)
    server.add_generic_rpc_handlers((handlers(
        table, counts, health_watch_cap(int(spec["max_watchers"]), _log)),))
    error, port = "", 0
    try:
        if spec["port"]:  # main's check, again: gRPC says only "0" (and C-core log lines)
            check_port("--health-port", spec["host"], spec["port"])
        port = server.add_insecure_port(spec["address"])
    except PortInUse as exc:
        error = str(exc)
    except RuntimeError as exc:  # grpc >= 1.5x raises; older ones return 0
        error = str(exc)
    if port == 0:
        error = error if error.startswith("argument") else (
            f"argument --health-port: cannot bind {spec['address']}: "
            f"{error or 'the address is not available'}")
        writer.write(wire.encode(wire.ERROR, error))
        await writer.drain()
        return 2
    await server.start()
    writer.write(wire.encode(wire.BOUND, port))
    await writer.drain()
    # The parent's log is not set up yet: this line is how a log reader (and ServerProcess)
    # learns the port before the model server's own lines.
    print(f"warmgate health process {os.getpid()}: serving grpc.health.v1 (plaintext) on "
          f"{spec['host']}:{port}", file=sys.stderr, flush=True)

    def flush() -> None:
        for (method, code), n in counts.items():
            writer.write(wire.encode(wire.COUNT, method, code, n))
        counts.clear()

    tasks = [asyncio.ensure_future(_every(FLUSH_S, flush)),
             asyncio.ensure_future(_every(min(1.0, table.heartbeat_timeout_s / 4),
                                          table.check_heartbeat))]
    try:
        await _follow_parent(reader, table)
        # The parent is gone. Its last statuses (a drain's NOT_SERVING comes just before its
        # end of file, often in the same read) still reach the Watch streams: the server
        # stops with a grace in which they are written, where an exit at once lost them.
        await server.stop(STOP_GRACE_S)
    finally:
        for task in tasks:
            task.cancel()
    os._exit(0)  # no drain of our own, no lingering port


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: end of file on the socket still ends us
        pass
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    spec, fd = json.loads(args[0]), int(args[1])
    _die_with_parent(int(spec["parent"]))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    import socket

    sock = socket.socket(fileno=fd)
    return asyncio.run(serve(spec, sock))


if __name__ == "__main__":
    sys.exit(main())
