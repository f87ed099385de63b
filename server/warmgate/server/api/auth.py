"""AuthInterceptor: a bearer token for every RPC except the read-only and probe ones.

Deny by default: only the methods in OPEN are reachable without the token, so an RPC added
later (a Generate, say) is protected without anyone remembering to list it. Health must stay
open (the kubelet's probe sends no metadata), and so do GetStatus, WatchStatus and reflection,
which only read.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeAlias

import grpc

# An interceptor sees every method, whatever its messages: they stay opaque here.
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

OPEN_METHODS = frozenset({"/warmgate.v1.Warmup/GetStatus", "/warmgate.v1.Warmup/WatchStatus"})
OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/",
                 "/grpc.reflection.v1.ServerReflection/")
MESSAGE = "missing or invalid bearer token: send the metadata 'authorization: Bearer <token>'"


def is_open(method: str) -> bool:
    return method in OPEN_METHODS or method.startswith(OPEN_PREFIXES)


def presented_token(metadata: Sequence[tuple[str, str | bytes]] | None) -> bytes | None:
    """The token of the first `authorization` entry, if it is a Bearer one."""
    for key, value in metadata or ():
        if key != "authorization":
            continue
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return token.strip().encode("utf-8", "surrogateescape")
    return None


def token_matches(presented: bytes | None, accepted: Sequence[bytes]) -> bool:
    """Constant time per token, and every token compared, so timing tells nothing."""
    if presented is None:
        return False
    match = False
    for token in accepted:
        match |= hmac.compare_digest(presented, token)
    return match


async def _deny_unary(request: object, context: Context) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, MESSAGE)


async def _deny_stream(request: object, context: Context) -> AsyncIterator[None]:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, MESSAGE)
    yield  # an async generator, so the streaming wrappers treat it as one


def _unread(data: bytes) -> None:
    """An unauthenticated request is refused unparsed: no work for it, and no parse error
    that would answer before UNAUTHENTICATED does."""


def _denied(handler: Handler) -> Handler:
    """A handler of the same shape as `handler` that only refuses."""
    out = handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_deny_unary, _unread, out)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(_deny_stream, _unread, out)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_deny_unary, _unread, out)
    return grpc.stream_stream_rpc_method_handler(_deny_stream, _unread, out)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: Sequence[bytes]) -> None:
        if not tokens:
            raise ValueError("AuthInterceptor needs at least one token")
        self._tokens = tuple(tokens)

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None or is_open(handler_call_details.method):
            return handler
        presented = presented_token(handler_call_details.invocation_metadata)
        if token_matches(presented, self._tokens):
            return handler
        return _denied(handler)
