"""Which transport between the front and the engine process: the cost of one realistic message
each way, side by side.

Two messages, the ones that cross on every step and on every request (control/engine_wire.py):
  step:   ("events", 128 StepEvents of one token each), what a decode step of 128 streams
          sends the front;
  submit: ("submit", a RequestWire of a 512-token prompt), what a new request sends the engine.
Transports, each to a real child process that decodes every message and answers with a small
acknowledgement:
  pipe:      warmgate's step channel (distributed/channel.py: length-prefixed pickle on a
             pipe), what the tensor-parallel workers already receive their steps on;
  mp-conn:   multiprocessing.connection over a Unix socket (Connection.send: pickle, framed);
  socketpair: the same framing as pipe on a Unix stream socketpair;
  shm:       a shared-memory mailbox (multiprocessing.shared_memory): the pickle is copied
             into the segment, and a one-byte doorbell on a pipe wakes the reader.
`round trip` is one message and its acknowledgement (the latency a step's events wait);
`streamed` sends N messages back to back, WINDOW unacknowledged at most, and times them
until the last is acknowledged (per message, and the MB/s that makes). pyzmq and msgspec are
not installed where the server runs, so they are not candidates.

    python bench/serve.py engine-transport [--messages 2000] [--streams 128] [--prompt 512]
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import struct
import subprocess
import sys
import time
from multiprocessing import resource_tracker, shared_memory
from multiprocessing.connection import Client, Connection, Listener
from statistics import median
from typing import IO, Any

from warmgate.server.control.engine_wire import RequestWire, events_to_wire
from warmgate.server.distributed.channel import encode, receive, send_encoded
from warmgate.server.runner.scheduler_output import SamplingParams
from warmgate.server.serving.request import StepEvent

SHM_BYTES = 1 << 22
WINDOW = 32  # messages in flight when streaming
_LEN = struct.Struct("<Q")
ACK = b"k"


def messages(streams: int, prompt_len: int) -> dict[str, Any]:
    now = time.perf_counter()
    events = [StepEvent(f"gen-{i}", [1000 + i], now) for i in range(streams)]
    submit = ("submit", RequestWire("gen-0", list(range(100, 100 + prompt_len)),
                                    SamplingParams(temperature=0.0, max_tokens=256), now))
    return {"step": ("events", events_to_wire(events)), "submit": submit}


def encodings(streams: int) -> list[str]:
    """What the step message costs to pickle and unpickle (both sides' CPU, whatever the
    transport) as StepEvent objects and as the rows the engine sends."""
    now = time.perf_counter()
    events = [StepEvent(f"gen-{i}", [1000 + i], now) for i in range(streams)]
    lines = []
    for label, build in (("StepEvent objects", lambda: ("events", events)),
                         ("rows (engine_wire)", lambda: ("events", events_to_wire(events)))):
        n = 500
        start = time.perf_counter()
        for _ in range(n):
            blob = pickle.dumps(build(), protocol=pickle.HIGHEST_PROTOCOL)
        dumps = (time.perf_counter() - start) / n
        start = time.perf_counter()
        for _ in range(n):
            pickle.loads(blob)
        loads = (time.perf_counter() - start) / n
        lines.append(f"step as {label:20} {len(blob):6d} bytes: {1e6 * dumps:7.1f} us to "
                     f"build and pickle, {1e6 * loads:7.1f} us to unpickle")
    return lines


# -- children: receive, decode, acknowledge ---------------------------------------------

def _child_stream(inp: IO[bytes], out: IO[bytes]) -> None:
    while receive(inp) is not None:
        out.write(ACK)
        out.flush()


def _child_mp_conn(name: str) -> None:
    with Client("\0" + name, family="AF_UNIX") as conn:
        while True:
            try:
                conn.recv()
            except EOFError:
                return
            conn.send_bytes(ACK)


def _child_shm(name: str) -> None:
    shm = shared_memory.SharedMemory(name=name)
    # Attaching registers the segment with this process's tracker, which would unlink it at
    # exit under the parent (Python < 3.13 has no track=False).
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    try:
        bell, out = sys.stdin.buffer, sys.stdout.buffer
        while bell.read(1):
            (n,) = _LEN.unpack_from(shm.buf, 0)
            pickle.loads(bytes(shm.buf[_LEN.size:_LEN.size + n]))
            out.write(ACK)
            out.flush()
    finally:
        shm.close()


# -- the parent's side of each transport ------------------------------------------------

def _child_argv(*args: str) -> list[str]:
    return [sys.executable, __file__, "--child", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


class PipeTransport:
    name = "pipe (warmgate channel)"

    def __init__(self) -> None:
        self.proc = subprocess.Popen(_child_argv("pipe"), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=_env())

    def send(self, message: Any) -> int:
        data = encode(message)
        send_encoded(self.proc.stdin, data)  # type: ignore[arg-type]
        return len(data)

    def ack(self) -> None:
        self.proc.stdout.read(1)  # type: ignore[union-attr]

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait()


class SocketPairTransport(PipeTransport):
    name = "socketpair (same framing)"

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.sock = ours
        self.proc = subprocess.Popen(_child_argv("socketpair", str(theirs.fileno())),
                                     pass_fds=(theirs.fileno(),), env=_env())
        theirs.close()
        self.wfile = ours.makefile("wb")
        self.rfile = ours.makefile("rb")

    def send(self, message: Any) -> int:
        data = encode(message)
        send_encoded(self.wfile, data)
        return len(data)

    def ack(self) -> None:
        self.rfile.read(1)

    def close(self) -> None:
        self.wfile.close()
        self.sock.shutdown(socket.SHUT_WR)
        self.proc.wait()
        self.rfile.close()
        self.sock.close()


class MpConnTransport:
    name = "multiprocessing.connection"

    def __init__(self) -> None:
        name = f"warmgate-bench-{os.getpid()}"
        self.listener = Listener("\0" + name, family="AF_UNIX")  # abstract: no file left
        self.proc = subprocess.Popen(_child_argv("mp-conn", name), env=_env())
        self.conn: Connection = self.listener.accept()

    def send(self, message: Any) -> int:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self.conn.send_bytes(data)  # what Connection.send does, with the size kept
        return len(data)

    def ack(self) -> None:
        self.conn.recv_bytes()

    def close(self) -> None:
        self.conn.close()
        self.proc.wait()
        self.listener.close()


class ShmTransport:
    name = "shared-memory mailbox"

    def __init__(self) -> None:
        self.shm = shared_memory.SharedMemory(create=True, size=SHM_BYTES)
        self.proc = subprocess.Popen(_child_argv("shm", self.shm.name), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=_env())

    def send(self, message: Any) -> int:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        _LEN.pack_into(self.shm.buf, 0, len(data))
        self.shm.buf[_LEN.size:_LEN.size + len(data)] = data
        self.proc.stdin.write(ACK)  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return len(data)

    def ack(self) -> None:
        self.proc.stdout.read(1)  # type: ignore[union-attr]

    # A mailbox holds one message: streaming waits for each acknowledgement.
    streams_unacked = False

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait()
        self.shm.close()
        self.shm.unlink()


def measure(transport: Any, message: Any, count: int) -> dict[str, float]:
    for _ in range(50):  # warm both sides (imports, first pickles, page faults)
        transport.send(message)
        transport.ack()
    trips = []
    size = 0
    for _ in range(count):
        start = time.perf_counter()
        size = transport.send(message)
        transport.ack()
        trips.append(time.perf_counter() - start)
    start = time.perf_counter()
    if getattr(transport, "streams_unacked", True):
        # In windows: a socket accounts each tiny unread acknowledgement at ~1 kB, so a
        # thousand unread ones fill its buffer and both sides would wait on each other.
        for first in range(0, count, WINDOW):
            sent = min(WINDOW, count - first)
            for _ in range(sent):
                transport.send(message)
            for _ in range(sent):
                transport.ack()
    else:
        for _ in range(count):
            transport.send(message)
            transport.ack()
    streamed = (time.perf_counter() - start) / count
    return {"bytes": size, "round_trip_us": 1e6 * median(trips), "streamed_us": 1e6 * streamed,
            "mb_s": size / streamed / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--streams", type=int, default=128, help="StepEvents per step message")
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens of the submit")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "pipe":
            _child_stream(sys.stdin.buffer, sys.stdout.buffer)
        elif kind == "socketpair":
            with socket.socket(fileno=int(rest[0])) as sock, sock.makefile("rb") as inp, \
                    sock.makefile("wb") as out:
                _child_stream(inp, out)
        elif kind == "mp-conn":
            _child_mp_conn(rest[0])
        elif kind == "shm":
            _child_shm(rest[0])
        return
    msgs = messages(args.streams, args.prompt)
    for line in encodings(args.streams):
        print(line)
    print(f"median round trip and streamed cost per message over {args.messages} messages; "
          f"step = {args.streams} StepEvents, submit = a {args.prompt}-token request")
    print(f"{'transport':30} {'message':7} {'bytes':>7} {'round trip us':>14} "
          f"{'streamed us':>12} {'MB/s':>8}")
    for cls in (PipeTransport, MpConnTransport, SocketPairTransport, ShmTransport):
        transport = cls()
        try:
            for label, message in msgs.items():
                r = measure(transport, message, args.messages)
                print(f"{transport.name:30} {label:7} {int(r['bytes']):7d} "
                      f"{r['round_trip_us']:14.1f} {r['streamed_us']:12.1f} {r['mb_s']:8.1f}")
        finally:
            transport.close()


if __name__ == "__main__":
    main()
