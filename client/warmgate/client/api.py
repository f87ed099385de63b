"""WarmgateClient: the synchronous client. Needs only grpcio, its health and status packages
and protobuf, never torch, so an orchestrator or probe can install it alone.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from warmgate.client.errors import WarmgateRpcError, from_rpc_error
from warmgate.client.generate import generate_request
from warmgate.client.security import ClientSecurity, sync_channel
from warmgate.v1 import generate_pb2 as gen_pb
from warmgate.v1 import generate_pb2_grpc as gen_grpc
from warmgate.v1 import warmup_pb2 as pb
from warmgate.v1 import warmup_pb2_grpc as pb_grpc

T = TypeVar("T")
DEFAULT_TARGET = "localhost:50051"
DEFAULT_TIMEOUT_S = 60.0
# How often wait_ready asks again while the server says NOT_SERVING.
POLL_INTERVAL_S = 0.25


class WaitResult(enum.Enum):
    READY = "ready"  # health SERVING
    FAILED = "failed"  # GetStatus says the warmup failed: waiting longer will not help
    TIMEOUT = "timeout"


def _call(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None


def _stream(call: Any) -> Iterator[Any]:
    """A server stream's messages; errors as WarmgateRpcError; cancelled when left early."""
    try:
        yield from call
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None
    finally:
        call.cancel()


class WarmgateClient:
    """Calls warmgate.v1.Warmup and grpc.health.v1.Health on one channel.

    `timeout` is the deadline of every call in seconds (None: no deadline); each method takes
    its own `timeout` to override it. `security` gives TLS/mTLS and a bearer token; the token
    goes with every call (the server ignores it where none is needed). Server errors raise
    WarmgateRpcError.
    """

    def __init__(self, target: str = DEFAULT_TARGET,
                 timeout: float | None = DEFAULT_TIMEOUT_S, *,
                 security: ClientSecurity | None = None) -> None:
        self.target = target
        self.timeout = timeout
        security = security or ClientSecurity()
        self._metadata = security.metadata()
        self._channel = sync_channel(target, security)
        self._warmup = pb_grpc.WarmupStub(self._channel)
        self._generation = gen_grpc.GenerationStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def __enter__(self) -> WarmgateClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    def warmup_kernels(self, force: bool = False, mixed_num_tokens: int | None = None, *,
                       timeout: float | None = None) -> pb.WarmupReport:
        request = pb.WarmupKernelsRequest(force=force, mixed_num_tokens=mixed_num_tokens)
        return _call(lambda: self._warmup.WarmupKernels(
            request, timeout=self._timeout(timeout), metadata=self._metadata))

    def mixed_warmup(self, num_tokens: int, force: bool = False, *,
                     timeout: float | None = None) -> pb.WarmupReport:
        request = pb.MixedWarmupRequest(num_tokens=num_tokens, force=force)
        return _call(lambda: self._warmup.MixedWarmup(
            request, timeout=self._timeout(timeout), metadata=self._metadata))

    def get_status(self, *, timeout: float | None = None) -> pb.WarmupStatus:
        return _call(lambda: self._warmup.GetStatus(
            pb.GetStatusRequest(), timeout=self._timeout(timeout), metadata=self._metadata))

    def watch_status(self, follow: bool = False, *, timeout: float | None = None
                     ) -> Iterator[pb.WarmupStatus]:
        """Statuses as they change; ends when the warmup settles (unless `follow`).

        No deadline unless `timeout` is given: a watch lasts as long as the warmup.
        """
        yield from _stream(self._warmup.WatchStatus(pb.WatchStatusRequest(follow=follow),
                                                timeout=timeout, metadata=self._metadata))

    def generate(self, prompt_token_ids: Sequence[int], *, timeout: float | None = None,
                 **sampling: Any) -> Iterator[gen_pb.GenerateResponse]:
        """Stream one request's tokens; `sampling` takes generate_request's keywords
        (temperature, top_k, top_p, seed, max_tokens, stop_token_ids, request_id).

        No deadline unless `timeout` is given. Leaving the loop early cancels the request on
        the server, which frees its KV blocks.
        """
        yield from _stream(self._generation.Generate(generate_request(prompt_token_ids, **sampling),
                                                 timeout=timeout, metadata=self._metadata))

    def health(self, service: str = "", *, timeout: float | None = None,
               wait_for_ready: bool = False) -> health_pb2.HealthCheckResponse.ServingStatus:
        request = health_pb2.HealthCheckRequest(service=service)
        # No token: health is open, as the kubelet's probe needs it to be.
        return _call(lambda: self._health.Check(request, timeout=self._timeout(timeout),
                                                wait_for_ready=wait_for_ready)).status

    def wait_ready(self, timeout: float, service: str = "") -> WaitResult:
        """Block until health says SERVING, the warmup fails, or `timeout` seconds pass.

        wait_for_ready makes each check wait for the server to come up instead of failing at
        once with UNAVAILABLE, so this can be called before the server has started.
        """
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                if self.health(service, timeout=left, wait_for_ready=True) == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return WaitResult.READY
                status = self.get_status(timeout=max(deadline - time.monotonic(), 0.001))
                if status.state == pb.WARMUP_STATE_FAILED:
                    return WaitResult.FAILED
            except WarmgateRpcError as exc:
                if exc.code is grpc.StatusCode.DEADLINE_EXCEEDED:
                    return WaitResult.TIMEOUT
                if exc.code is not grpc.StatusCode.UNAVAILABLE:  # stopping or restarting
                    raise
            time.sleep(max(0.0, min(POLL_INTERVAL_S, deadline - time.monotonic())))
        return WaitResult.TIMEOUT
