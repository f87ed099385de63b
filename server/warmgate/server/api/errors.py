"""The one place that maps exceptions to gRPC status codes and rich error details.

Handlers and the controller raise the domain errors below; `ErrorInterceptor` (interceptor.py)
turns them into statuses with this module. Validation is never an `assert`: asserts vanish
under `python -O`, and a bad request must be an INVALID_ARGUMENT, not a crash.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from warmgate.server.core.failures import is_fatal_device_error

logger = logging.getLogger(__name__)


class WarmgateError(Exception):
    """A failure the client can act on; `code` is the gRPC status it maps to."""

    code = grpc.StatusCode.UNKNOWN

    def details(self) -> list[any_pb2.Any]:
        return []


@dataclass(frozen=True)
class FieldViolation:
    field: str  # the request field, as the proto spells it
    description: str


class InvalidArgument(WarmgateError):
    """The request itself is wrong; retrying it unchanged will fail again."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, *violations: FieldViolation) -> None:
        super().__init__("; ".join(f"{v.field}: {v.description}" for v in violations))
        self.violations = violations

    def details(self) -> list[any_pb2.Any]:
        bad = error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
            for v in self.violations])
        return [_pack(bad)]


class FailedPrecondition(WarmgateError):
    """The server's state forbids the call (e.g. the model failed to load)."""

    code = grpc.StatusCode.FAILED_PRECONDITION

    def __init__(self, subject: str, reason: str) -> None:
        super().__init__(f"{subject}: {reason}")
        self.subject = subject
        self.reason = reason

    def details(self) -> list[any_pb2.Any]:
        failure = error_details_pb2.PreconditionFailure(violations=[
            error_details_pb2.PreconditionFailure.Violation(
                type="STATE", subject=self.subject, description=self.reason)])
        return [_pack(failure)]


class ShuttingDown(WarmgateError):
    """The server is stopping; another replica should take the call."""

    code = grpc.StatusCode.UNAVAILABLE

    def __init__(self) -> None:
        super().__init__("the server is shutting down")


class Unavailable(WarmgateError):
    """Not now, try again (here once ready, or on another replica): the message says why."""

    code = grpc.StatusCode.UNAVAILABLE


class ResourceExhausted(WarmgateError):
    """Out of a resource (device memory, queue room); the message names the setting."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


def _pack(message: error_details_pb2.BadRequest | error_details_pb2.PreconditionFailure
          ) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def to_grpc_status(exc: BaseException) -> grpc.Status:
    """A grpc.Status (code, message, google.rpc.Status trailer) for any exception.

    Anything that is not a WarmgateError is a bug on our side: INTERNAL, with the type and
    message so the caller can report it, and the traceback logged here. The exception is a
    fatal device error, which is UNAVAILABLE: not a bug, and not this replica's to answer.
    """
    if isinstance(exc, WarmgateError):
        code, message, details = exc.code, str(exc), exc.details()
    elif is_fatal_device_error(exc):
        # The process is about to exit (main restarts it): another replica can take the call.
        code, message, details = (grpc.StatusCode.UNAVAILABLE,
                                  f"the device failed ({type(exc).__name__}: {exc}); the "
                                  "server is restarting", [])
    else:
        logger.error("unhandled %s in an RPC", type(exc).__name__, exc_info=exc)
        code, message, details = (grpc.StatusCode.INTERNAL,
                                  f"internal error: {type(exc).__name__}: {exc}", [])
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=message,
                               details=details)
    return rpc_status.to_status(status)


async def abort(context: grpc.aio.ServicerContext, exc: BaseException) -> NoReturn:
    status = to_grpc_status(exc)
    await context.abort(status.code, status.details, trailing_metadata=status.trailing_metadata)
    raise AssertionError("unreachable: context.abort raises")  # for type checkers
