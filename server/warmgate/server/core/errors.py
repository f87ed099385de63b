"""The failures a client can act on, as the domain raises them (no transport in sight).

The controller, the serving driver and the request handlers raise these; the gRPC layer
(warmgate.server.api.errors) is the one place that turns each kind into a status code and
its rich details. Validation is never an `assert`: asserts vanish under `python -O`, and a
bad request must be refused as such, not crash.
"""

from __future__ import annotations

from dataclasses import dataclass


class WarmgateError(Exception):
    """A failure the client can act on; its class says which kind (and so which status)."""


@dataclass(frozen=True)
class FieldViolation:
    field: str  # the request field, as the proto spells it
    description: str


class InvalidArgument(WarmgateError):
    """The request itself is wrong; retrying it unchanged will fail again."""

    def __init__(self, *violations: FieldViolation) -> None:
        super().__init__("; ".join(f"{v.field}: {v.description}" for v in violations))
        self.violations = violations


class FailedPrecondition(WarmgateError):
    """The server's state forbids the call (e.g. the model failed to load)."""

    def __init__(self, subject: str, reason: str) -> None:
        super().__init__(f"{subject}: {reason}")
        self.subject = subject
        self.reason = reason


class Unavailable(WarmgateError):
    """Not now, try again (here once ready, or on another replica): the message says why."""


class ShuttingDown(Unavailable):
    """The server is stopping; another replica should take the call."""

    def __init__(self) -> None:
        super().__init__("the server is shutting down")


class ResourceExhausted(WarmgateError):
    """Out of a resource (device memory, queue room); the message names the setting."""
