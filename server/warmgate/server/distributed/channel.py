"""The step broadcast: rank 0 sends each call's arguments to every worker over its stdin pipe.

Why a pipe and not a collective: a worker waits for the next step for as long as the server
is idle (hours), and a gloo or NCCL receive would time out there; a blocking read on a pipe
waits forever at no cost and returns end-of-file the moment rank 0 is gone (kill -9
included), which is how a worker knows to exit, so no orphan outlives the server. A step's
metadata is a few kB; pickling it once and writing it into N-1 pipes is one system call per
worker and per side, the same as vLLM's shared-memory queue for messages of this size
(bench/serve.py tp-broadcast prints the cost per decode step).
"""

from __future__ import annotations

import pickle
import struct
from typing import IO, Any

_HEADER = struct.Struct("<Q")  # the pickled message's length


def encode(message: Any) -> bytes:
    blob = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(blob)) + blob


def send_encoded(stream: IO[bytes], data: bytes) -> None:
    stream.write(data)
    stream.flush()


def _read_exact(stream: IO[bytes], n: int) -> bytes | None:
    chunks: list[bytes] = []
    while n:
        chunk = stream.read(n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def receive(stream: IO[bytes]) -> Any | None:
    """The next message, or None once the sender is gone (end of file)."""
    head = _read_exact(stream, _HEADER.size)
    if head is None:
        return None
    blob = _read_exact(stream, _HEADER.unpack(head)[0])
    if blob is None:
        return None
    return pickle.loads(blob)  # our own parent process, over a private pipe
