"""Workers' replies to rank 0: every JIT event a worker rank records (a compile, a cache load,
a CUDA-graph miss, a communicator set-up) reaches rank 0's JIT monitor, which counts it under
the worker's rank and hands it to the metrics (`rank` label) and to --strict-jit.

Each worker writes its events into a pipe of its own (`--reply-fd`, the reverse of its step
channel), the moment the event happens, from whatever thread recorded it; a reader thread
per worker on rank 0 passes them on. Nothing is written unless something compiled, missed
or set up, so a steady-state step pays nothing, and there is no collective: a worker that
dies closes its pipe and its reader ends. Whether an event came after ready is the worker's
call, from the readiness rank 0 sends with every step (runners.py), so a worker's event is
judged against the same ready as rank 0's own.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from typing import IO

from warmgate.server.distributed.channel import encode, receive, send_encoded
from warmgate.server.jit.events import JitEvent

logger = logging.getLogger(__name__)

Sink = Callable[[JitEvent], None]
JIT = "jit"  # the one kind of reply so far: (JIT, JitEvent)


class ReplySender:
    """A worker's side: a JitMonitor listener that writes each event to rank 0."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._lock = threading.Lock()  # compiles may be recorded on several threads

    def __call__(self, event: JitEvent) -> None:
        data = encode((JIT, event))
        with self._lock, contextlib.suppress(OSError, ValueError):  # rank 0 gone: exiting
            send_encoded(self._stream, data)

    def close(self) -> None:
        with self._lock, contextlib.suppress(OSError):
            self._stream.close()


class ReplyReader:
    """Rank 0's side: one thread per worker pipe; events wait until `relay_to` names where
    they go (a worker records its load's events before rank 0's runner exists)."""

    def __init__(self, streams: Mapping[int, IO[bytes]]) -> None:
        self._lock = threading.Lock()
        self._sink: Sink | None = None
        self._pending: list[JitEvent] = []
        self._threads = [threading.Thread(target=self._read, args=(rank, stream),
                                          name=f"tp-replies-{rank}", daemon=True)
                         for rank, stream in streams.items()]
        for thread in self._threads:
            thread.start()

    def relay_to(self, sink: Sink) -> None:
        with self._lock:
            self._sink, pending, self._pending = sink, self._pending, []
        for event in pending:
            sink(event)

    def _read(self, rank: int, stream: IO[bytes]) -> None:
        with stream:
            while True:
                try:
                    message = receive(stream)
                except Exception:  # a torn message from a dying worker: its watchdog reports
                    logger.exception("rank %d: unreadable reply", rank)
                    return
                if message is None:
                    return  # the worker exited
                kind, event = message
                if kind != JIT or not isinstance(event, JitEvent):
                    logger.warning("rank %d: unknown reply %r", rank, kind)
                    continue
                with self._lock:
                    sink = self._sink
                    if sink is None:
                        self._pending.append(event)
                if sink is not None:
                    sink(event)

    def join(self, timeout_s: float) -> None:
        """After the workers exited: their pipes are at end of file."""
        for thread in self._threads:
            thread.join(timeout_s)
