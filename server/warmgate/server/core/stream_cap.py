"""A cap on the open streams of one kind (WatchStatus, the health Watch), or on the metrics
port's connections (telemetry/metrics.py).

Each open stream holds memory in the process that serves it and gets a message per status
change on the loop that answers health, and each metrics connection holds a thread of the
gRPC front process: an unauthenticated client must not be able to open them without end
(10,000 health Watch streams grew the server by 182 MiB; 3,000 idle metrics connections made
3,026 threads, and closing them pushed health past its deadline). Past the cap a new one is
refused (RESOURCE_EXHAUSTED, HTTP 503) by its caller, with the message this gives; a closed
one frees its slot.

A cap has no lock: one event loop touches the streams' caps; the metrics port's connection
cap is taken under its server's own lock. Imports nothing of warmgate's, so the health
process (api/health_process.py) uses it too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

# How a cap reports reaching its limit and falling below it again: (level, message).
Log = Callable[[int, str], None]


class StreamCap:
    def __init__(self, kind: str, flag: str, limit: int, advice: str,
                 log: Log = logger.log, *, unit: str = "streams") -> None:
        self.kind, self.flag, self.limit, self.advice = kind, flag, limit, advice
        self.unit = unit  # what is counted, for the messages
        self.open = 0
        self._log = log
        self._refusing = False  # logged once per stretch at the cap, not once per refusal

    def take(self) -> str | None:
        """Count one more open stream and return None, or, at the cap, return the refusal's
        message (counting nothing)."""
        if self.open >= self.limit:
            if not self._refusing:
                self._refusing = True
                self._log(logging.WARNING, f"{self.kind} at its cap: {self.open} {self.unit} "
                          f"open ({self.flag} {self.limit}); refusing new ones until one "
                          "closes")
            return (f"{self.open} {self.kind} {self.unit} are open, the most this server "
                    f"allows ({self.flag} {self.limit}); {self.advice}")
        self.open += 1
        return None

    def release(self) -> None:
        """A stream `take` counted has ended."""
        self.open -= 1
        if self._refusing and self.open < self.limit:
            self._refusing = False
            self._log(logging.INFO, f"{self.kind} below its cap again: {self.open} of "
                      f"{self.limit} {self.unit} open")


def health_watch_cap(limit: int, log: Log = logger.log) -> StreamCap:
    """grpc.health.v1 Watch's cap: the main port's (api/health.py) and the health process's
    each count their own streams."""
    return StreamCap("health Watch", "--max-health-watchers", limit,
                     "close one or poll Check", log)
