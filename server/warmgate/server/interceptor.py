"""ErrorInterceptor: maps every handler exception to a status and counts every RPC.

Wrapping the handlers (rather than decorating each method) covers health checks too, so
`warmgate_rpc_duration_seconds{method="/grpc.health.v1.Health/Check"}` shows whether probes
stay fast while kernels compile. Stream-stream handlers (reflection) pass through untouched.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from warmgate.server import errors
from warmgate.server.metrics import Metrics


def _code_name(context: grpc.aio.ServicerContext) -> str:
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


async def _on_error(exc: BaseException, context: grpc.aio.ServicerContext,
                    outcome: _Outcome) -> None:
    """Re-raise exc as the status it maps to; record the code."""
    if isinstance(exc, asyncio.CancelledError):
        # The client went away (cancel or deadline): nothing to answer.
        outcome.code = grpc.StatusCode.CANCELLED.name
        raise exc
    if isinstance(exc, grpc.aio.AbortError):
        outcome.code = _code_name(context)  # the handler (or health) aborted by itself
        raise exc
    outcome.code = errors.to_grpc_status(exc).code.name
    await errors.abort(context, exc)


def _wrap_unary(behavior: Callable[..., Awaitable[Any]], metrics: Metrics | None,
                method: str) -> Callable[..., Awaitable[Any]]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        outcome = _Outcome(metrics, method)
        try:
            return await behavior(request, context)
        except BaseException as exc:
            await _on_error(exc, context, outcome)
        finally:
            if outcome.code == grpc.StatusCode.OK.name:
                outcome.code = _code_name(context)
            outcome.record()

    return handler


def _wrap_stream(behavior: Callable[..., Any], metrics: Metrics | None,
                 method: str) -> Callable[..., Any]:
    if not inspect.isasyncgenfunction(behavior):
        # A coroutine handler that writes with context.write (the health Watch).
        return _wrap_unary(behavior, metrics, method)

    async def handler(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        outcome = _Outcome(metrics, method)
        try:
            async for message in behavior(request, context):
                yield message
        except BaseException as exc:
            await _on_error(exc, context, outcome)
        finally:
            outcome.record()

    return handler


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: Metrics | None = None) -> None:
        self._metrics = metrics

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails],
                                     Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary, self._metrics, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream, self._metrics, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        return handler
