"""The pipe between warmgate-server and its health process (api/health_process.py): one JSON
array per line over a Unix socketpair, stdlib only, so the child imports nothing heavy.

Parent to child:
  ["set", service, status]   a service's status (grpc.health.v1's ServingStatus number)
  ["beat"]                   the parent's event loop ran (api/health_link.py sends one a second)
Child to parent:
  ["bound", port]            the health port is bound and served; the parent goes on
  ["error", reason]          it could not bind; the child exits 2
  ["count", method, code, n] n calls of method ended with code (a batch, about once a second)
End of file on either side ends the other: the child exits at once when the parent's end
closes (the parent exited or was killed), and the parent logs a child that went away.
"""

from __future__ import annotations

import json
from typing import Any

# grpc.health.v1.HealthCheckResponse.ServingStatus, without importing the proto here.
SERVING = 1
NOT_SERVING = 2
SERVICE_UNKNOWN = 3

# A heartbeat a second; liveness turns NOT_SERVING after HEARTBEAT_TIMEOUT_S without one. The
# main port's liveness Check failed as soon as the event loop stalled for the probe's 1 s
# timeout; 10 s leaves room for a legitimate stall (a long compile call holding the GIL, a
# garbage collection of a big heap) and is far inside the liveness probe's budget (6 x 10 s
# in deploy/base), so a wedged loop still gets the pod restarted about as fast as before.
HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_TIMEOUT_S = 10.0
# How long the parent waits for the child's bind report (its interpreter, grpc and the bind).
START_TIMEOUT_S = 30.0

SET, BEAT, BOUND, ERROR, COUNT = "set", "beat", "bound", "error", "count"
BEAT_LINE = b'["beat"]\n'


def encode(*message: Any) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> list[Any]:
    """One message; ValueError for a line that is not one (a bug on the other side)."""
    message = json.loads(line)
    if not isinstance(message, list) or not message or not isinstance(message[0], str):
        raise ValueError(f"not a health message: {line!r}")
    return message
