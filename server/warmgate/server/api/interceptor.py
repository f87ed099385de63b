"""ErrorInterceptor: maps every handler exception to a status and counts every RPC.

Wrapping the handlers (rather than decorating each method) covers health checks too, so
`warmgate_rpc_duration_seconds{method="/grpc.health.v1.Health/Check"}` shows whether probes
stay fast while kernels compile.

It also owns two decisions no handler can make:
- request bytes that do not parse: grpc deserializes before any handler runs and answers a
  failure as UNKNOWN. The wrapped deserializer hands the handler a marker instead, answered as
  INVALID_ARGUMENT with a BadRequest violation, for every method (health and reflection too).
- a fatal device error escaping a handler: `on_fatal` (the controller's device_lost) takes
  the server down, and the caller gets UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

import grpc
from google.protobuf.message import Message

from warmgate.server.api import errors
from warmgate.server.core.errors import FieldViolation, InvalidArgument
from warmgate.server.core.failures import is_fatal_device_error
from warmgate.server.telemetry.metrics import Metrics

OnFatal = Callable[[BaseException], Awaitable[None]]
# The interceptor wraps every method, whatever its messages: they stay opaque here.
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
REQUEST_FIELD = "request"  # the BadRequest field named when the whole message does not parse


class _Undecodable:
    """What the handler gets in place of a request whose bytes did not parse."""

    def __init__(self, type_name: str, error: Exception) -> None:
        self.violation = FieldViolation(
            REQUEST_FIELD, f"not a valid {type_name}: {type(error).__name__}: {error}")


def _message_name(deserializer: Callable[[bytes], Any]) -> str:
    """The request type's full name, when the deserializer is its Message.FromString (as
    generated code registers it), for the violation's text."""
    # upb binds FromString as a builtin method, the pure-Python runtime as a classmethod.
    if inspect.isbuiltin(deserializer) or inspect.ismethod(deserializer):
        owner = deserializer.__self__
        if isinstance(owner, type) and issubclass(owner, Message):
            return owner.DESCRIPTOR.full_name
    return "request message"


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None
    type_name = _message_name(deserializer)

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # DecodeError, or invalid UTF-8 in a string field
            return _Undecodable(type_name, exc)

    return deserialize


def _check(request: Any) -> Any:
    if isinstance(request, _Undecodable):
        raise InvalidArgument(request.violation)
    return request


def _code_name(context: Context) -> str:
    code = context.code()
    if code is None:
        return grpc.StatusCode.OK.name
    if isinstance(code, grpc.StatusCode):
        return code.name
    # grpc.aio stores the abort code as an int in some paths; map it back to its name.
    for candidate in grpc.StatusCode:
        if candidate.value[0] == code:
            return candidate.name
    return grpc.StatusCode.UNKNOWN.name


class _Outcome:
    """Times one call and records it once, whatever way it ends."""

    def __init__(self, metrics: Metrics | None, method: str) -> None:
        self._metrics, self._method = metrics, method
        self._start = time.perf_counter()
        self.code = grpc.StatusCode.OK.name

    def record(self) -> None:
        if self._metrics is not None:
            self._metrics.observe_rpc(self._method, self.code, time.perf_counter() - self._start)


async def _on_error(exc: BaseException, context: Context,
                    outcome: _Outcome, on_fatal: OnFatal | None) -> None:
    """Re-raise exc as the status it maps to; record the code."""
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        # The client went away (cancel or deadline; a stream's generator is closed with
        # GeneratorExit): nothing to answer, and aborting a finished call would fail.
        outcome.code = grpc.StatusCode.CANCELLED.name
        raise exc
    if isinstance(exc, grpc.aio.AbortError):
        outcome.code = _code_name(context)  # the handler (or health) aborted by itself
        raise exc
    if on_fatal is not None and is_fatal_device_error(exc):
        await on_fatal(exc)
    # Mapped once: the mapping logs an INTERNAL's traceback, which a second call repeated.
    status = errors.to_grpc_status(exc)
    outcome.code = status.code.name
    await errors.abort(context, status)


def _wrap_unary(behavior: Callable[..., Awaitable[Any]], metrics: Metrics | None,
                method: str, on_fatal: OnFatal | None) -> Callable[..., Awaitable[Any]]:
    async def handler(request: Any, context: Context) -> Any:
        outcome = _Outcome(metrics, method)
        try:
            return await behavior(_check(request), context)
        except BaseException as exc:
            await _on_error(exc, context, outcome, on_fatal)
        finally:
            if outcome.code == grpc.StatusCode.OK.name:
                outcome.code = _code_name(context)
            outcome.record()

    return handler


def _wrap_stream(behavior: Callable[..., Any], metrics: Metrics | None,
                 method: str, on_fatal: OnFatal | None) -> Callable[..., Any]:
    if not inspect.isasyncgenfunction(behavior):
        # A coroutine handler that writes with context.write (the health Watch).
        return _wrap_unary(behavior, metrics, method, on_fatal)

    async def handler(request: Any, context: Context) -> AsyncIterator[Any]:
        outcome = _Outcome(metrics, method)
        # An async generator: only those get here (isasyncgenfunction above).
        stream: AsyncGenerator[Any, None] | None = None
        try:
            stream = behavior(_check(request), context)
            async for message in stream:
                yield message
        except BaseException as exc:
            await _on_error(exc, context, outcome, on_fatal)
        finally:
            # Close the handler's generator now, not whenever it is collected: its own
            # clean-up (a cancelled Generate freeing its KV blocks) must run at the cancel.
            if stream is not None:
                await stream.aclose()
            outcome.record()

    return handler


def _wrap_bidi(behavior: Callable[..., Any], metrics: Metrics | None, method: str,
               on_fatal: OnFatal | None) -> Callable[..., Any]:
    """Stream-stream (reflection): every incoming message is checked as it is read."""

    async def handler(requests: AsyncIterator[Any], context: Context
                      ) -> AsyncIterator[Any]:
        async def checked() -> AsyncIterator[Any]:
            async for request in requests:
                yield _check(request)

        outcome = _Outcome(metrics, method)
        try:
            async for message in behavior(checked(), context):
                yield message
        except BaseException as exc:
            await _on_error(exc, context, outcome, on_fatal)
        finally:
            outcome.record()

    return handler


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: Metrics | None = None, *, on_fatal: OnFatal | None = None
                 ) -> None:
        self._metrics = metrics
        self._on_fatal = on_fatal
        # method -> (the registered handler, its wrapped twin): wrapping builds closures and
        # a new method handler, work a burst of thousands of health checks would repeat.
        # Only registered methods get here (an unknown one's handler is None), so it is small.
        self._wrapped: dict[str, tuple[Handler, Handler]] = {}

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails],
                                     Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap(handler, method)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, handler: Handler, method: str) -> Handler:
        wrap = (self._metrics, method, self._on_fatal)
        codec = {"request_deserializer": _tolerant(handler.request_deserializer),
                 "response_serializer": handler.response_serializer}
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary, *wrap), **codec)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream, *wrap), **codec)
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                _wrap_bidi(handler.stream_stream, *wrap), **codec)
        return handler  # stream-unary: none is registered
