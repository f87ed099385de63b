"""AsyncWarmgateClient: WarmgateClient's API for asyncio callers (grpc.aio channel)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from warmgate.client.api import DEFAULT_TARGET, DEFAULT_TIMEOUT_S, POLL_INTERVAL_S, WaitResult
from warmgate.client.errors import WarmgateRpcError, from_rpc_error
from warmgate.client.generate import generate_request
from warmgate.client.security import ClientSecurity, aio_channel
from warmgate.v1 import generate_pb2 as gen_pb
from warmgate.v1 import generate_pb2_grpc as gen_grpc
from warmgate.v1 import warmup_pb2 as pb
from warmgate.v1 import warmup_pb2_grpc as pb_grpc

T = TypeVar("T")


async def _call(call: Awaitable[T]) -> T:
    try:
        return await call
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None


async def _stream(call: Any) -> AsyncIterator[Any]:
    """A server stream's messages; errors as WarmgateRpcError; cancelled when left early."""
    try:
        async for message in call:
            yield message
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None
    finally:
        call.cancel()


class AsyncWarmgateClient:
    """See WarmgateClient; every method is a coroutine and watch_status an async iterator.

    Create it inside the event loop that will use it (grpc.aio channels bind to one loop).
    """

    def __init__(self, target: str = DEFAULT_TARGET,
                 timeout: float | None = DEFAULT_TIMEOUT_S, *,
                 security: ClientSecurity | None = None) -> None:
        self.target = target
        self.timeout = timeout
        security = security or ClientSecurity()
        self._metadata = security.metadata()
        self._channel = aio_channel(target, security)
        self._warmup = pb_grpc.WarmupStub(self._channel)
        self._generation = gen_grpc.GenerationStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    async def __aenter__(self) -> AsyncWarmgateClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    async def warmup_kernels(self, force: bool = False, mixed_num_tokens: int | None = None, *,
                             timeout: float | None = None) -> pb.WarmupReport:
        request = pb.WarmupKernelsRequest(force=force, mixed_num_tokens=mixed_num_tokens)
        return await _call(self._warmup.WarmupKernels(
            request, timeout=self._timeout(timeout), metadata=self._metadata))

    async def mixed_warmup(self, num_tokens: int, force: bool = False, *,
                           timeout: float | None = None) -> pb.WarmupReport:
        request = pb.MixedWarmupRequest(num_tokens=num_tokens, force=force)
        return await _call(self._warmup.MixedWarmup(
            request, timeout=self._timeout(timeout), metadata=self._metadata))

    async def get_status(self, *, timeout: float | None = None) -> pb.WarmupStatus:
        return await _call(self._warmup.GetStatus(
            pb.GetStatusRequest(), timeout=self._timeout(timeout), metadata=self._metadata))

    def watch_status(self, follow: bool = False, *, timeout: float | None = None
                     ) -> AsyncIterator[pb.WarmupStatus]:
        """Statuses as they change; ends when the warmup settles (unless `follow`).

        No deadline unless `timeout` is given: a watch lasts as long as the warmup.
        """
        return _stream(self._warmup.WatchStatus(pb.WatchStatusRequest(follow=follow),
                                                timeout=timeout, metadata=self._metadata))

    def generate(self, prompt_token_ids: Sequence[int] = (), *, timeout: float | None = None,
                 **sampling: Any) -> AsyncIterator[gen_pb.GenerateResponse]:
        """See WarmgateClient.generate. The call starts here; iterate (or aclose) the result."""
        return _stream(self._generation.Generate(generate_request(prompt_token_ids, **sampling),
                                                 timeout=timeout, metadata=self._metadata))

    async def health(self, service: str = "", *, timeout: float | None = None,
                     wait_for_ready: bool = False
                     ) -> health_pb2.HealthCheckResponse.ServingStatus:
        request = health_pb2.HealthCheckRequest(service=service)
        response = await _call(self._health.Check(request, timeout=self._timeout(timeout),
                                                  wait_for_ready=wait_for_ready))
        return response.status

    async def wait_ready(self, timeout: float, service: str = "") -> WaitResult:
        """See WarmgateClient.wait_ready."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                if await self.health(service, timeout=left, wait_for_ready=True) == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return WaitResult.READY
                status = await self.get_status(timeout=max(deadline - time.monotonic(), 0.001))
                if status.state == pb.WARMUP_STATE_FAILED:
                    return WaitResult.FAILED
            except WarmgateRpcError as exc:
                if exc.code is grpc.StatusCode.DEADLINE_EXCEEDED:
                    return WaitResult.TIMEOUT
                if exc.code is not grpc.StatusCode.UNAVAILABLE:
                    raise
            await asyncio.sleep(max(0.0, min(POLL_INTERVAL_S, deadline - time.monotonic())))
        return WaitResult.TIMEOUT
