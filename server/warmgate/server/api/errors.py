"""The one place that maps exceptions to gRPC status codes and rich error details.

Handlers, the controller and the serving driver raise the domain errors of
warmgate.server.core.errors, which know nothing of gRPC; `ErrorInterceptor` (interceptor.py)
turns them into statuses with this module.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from warmgate.server.core.errors import (
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
    WarmgateError,
)
from warmgate.server.core.failures import is_fatal_device_error
from warmgate.server.core.tracebacks import log_failure

logger = logging.getLogger(__name__)


# Each domain error's status, most specific first: a subclass takes its listed base's.
_CODES: dict[type[WarmgateError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    WarmgateError: grpc.StatusCode.UNKNOWN,
}


def status_code_of(exc: WarmgateError) -> grpc.StatusCode:
    """The status a domain error maps to: the first entry of _CODES it is an instance of."""
    return next(code for cls, code in _CODES.items() if isinstance(exc, cls))


def details_of(exc: WarmgateError) -> list[any_pb2.Any]:
    """The google.rpc detail messages that let a client act on `exc` without parsing text."""
    if isinstance(exc, InvalidArgument):
        bad = error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
            for v in exc.violations])
        return [_pack(bad)]
    if isinstance(exc, FailedPrecondition):
        failure = error_details_pb2.PreconditionFailure(violations=[
            error_details_pb2.PreconditionFailure.Violation(
                type="STATE", subject=exc.subject, description=exc.reason)])
        return [_pack(failure)]
    return []


def _pack(message: error_details_pb2.BadRequest | error_details_pb2.PreconditionFailure
          ) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def to_grpc_status(exc: BaseException) -> grpc.Status:
    """A grpc.Status (code, message, google.rpc.Status trailer) for any exception.

    Anything that is not a WarmgateError is a bug on our side: INTERNAL, with the type and
    message so the caller can report it, and the traceback logged here (once per exception:
    call it once per RPC, and a step's failure that the serving loop logged already gets a
    line). The exception is a fatal device error, which is UNAVAILABLE: not a bug, and not
    this replica's to answer.
    """
    if isinstance(exc, WarmgateError):
        code, message, details = status_code_of(exc), str(exc), details_of(exc)
    elif is_fatal_device_error(exc):
        # The process is about to exit (main restarts it): another replica can take the call.
        code, message, details = (grpc.StatusCode.UNAVAILABLE,
                                  f"the device failed ({type(exc).__name__}: {exc}); the "
                                  "server is restarting", [])
    else:
        log_failure(logger, exc, "unhandled %s in an RPC: INTERNAL", type(exc).__name__)
        code, message, details = (grpc.StatusCode.INTERNAL,
                                  f"internal error: {type(exc).__name__}: {exc}", [])
    # grpc.StatusCode's number is google.rpc.Code's: the same table (status.proto).
    status = status_pb2.Status(code=code.value[0], message=message, details=details)
    return rpc_status.to_status(status)


async def abort(context: grpc.aio.ServicerContext[Any, Any], status: grpc.Status) -> NoReturn:
    """End the call with `status` (to_grpc_status's; any RPC: its messages do not matter)."""
    await context.abort(status.code, status.details, trailing_metadata=status.trailing_metadata)
    raise AssertionError("unreachable: context.abort raises")  # for type checkers
