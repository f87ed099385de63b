"""Server errors as one exception type carrying the google.rpc details the server attached."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


@dataclass(frozen=True)
class Violation:
    """One thing wrong: a request field (BadRequest) or a server state (PreconditionFailure)."""

    subject: str
    description: str


@dataclass
class WarmgateRpcError(Exception):
    code: grpc.StatusCode
    message: str
    field_violations: list[Violation] = field(default_factory=list)
    precondition_violations: list[Violation] = field(default_factory=list)

    def __str__(self) -> str:
        """One line, as every other CLI error: `CODE: field f: what is wrong`. The message
        repeats the violations for clients that do not decode details; when they are present
        they are the clearer text, several joined with `; `."""
        parts = [f"field {v.subject}: {v.description}" for v in self.field_violations]
        parts += [f"precondition {v.subject}: {v.description}"
                  for v in self.precondition_violations]
        return f"{self.code.name}: {'; '.join(parts) if parts else self.message}"


def from_rpc_error(error: grpc.RpcError) -> WarmgateRpcError:
    """Decode a failed call (sync grpc.RpcError or grpc.aio.AioRpcError; both are Calls).

    rpc_status.from_call reads the `grpc-status-details-bin` trailer; an error without one
    (UNAVAILABLE from the channel, DEADLINE_EXCEEDED) keeps just its code and message.
    """
    code: grpc.StatusCode = error.code()  # type: ignore[attr-defined]
    message: str = error.details() or ""  # type: ignore[attr-defined]
    out = WarmgateRpcError(code, message)
    try:
        status = rpc_status.from_call(error)  # type: ignore[arg-type]
    except ValueError:  # a trailer that contradicts the call's code: keep the code
        status = None
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            out.field_violations += [Violation(v.field, v.description)
                                     for v in bad.field_violations]
        elif detail.Is(error_details_pb2.PreconditionFailure.DESCRIPTOR):
            failure = error_details_pb2.PreconditionFailure()
            detail.Unpack(failure)
            out.precondition_violations += [Violation(v.subject, v.description)
                                            for v in failure.violations]
    return out
