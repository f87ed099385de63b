"""WarmgateClient: the synchronous client. Needs only grpcio, its health and status packages
and protobuf, never torch, so an orchestrator or probe can install it alone.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from warmgate.client.errors import WarmgateRpcError, from_rpc_error
from warmgate.client.generate import generate_request
from warmgate.client.identity import ServerIdentityError, check_process_alive, check_server_pid
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
    # Asked for a server pid: that process exited, or another one answers on the target.
    WRONG_SERVER = "wrong server"


@dataclass(frozen=True)
class WaitOutcome:
    result: WaitResult
    # What the server last answered: "SERVING", the failure reason, "NOT_SERVING: state
    # RUNNING, phase ...", the channel's UNAVAILABLE message, or why it is the wrong server.
    last_seen: str


def _not_serving(status: pb.WarmupStatus) -> str:
    state = pb.WarmupState.Name(status.state).removeprefix("WARMUP_STATE_")
    phase = (f", phase {status.current_phase} ({status.phase_index + 1}/{status.num_phases}) "
             f"step {status.steps_done}/{status.steps_total}" if status.current_phase else "")
    return f"NOT_SERVING: state {state}{phase}"


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
                       timeout: float | None = None,
                       on_progress: Callable[[pb.WarmupStatus], None] | None = None
                       ) -> pb.WarmupReport:
        """Run the warmup plan; `on_progress` gets every WatchStatus update while it runs."""
        request = pb.WarmupKernelsRequest(force=force, mixed_num_tokens=mixed_num_tokens)
        return self._unary(self._warmup.WarmupKernels, request, timeout, on_progress)

    def mixed_warmup(self, num_tokens: int, force: bool = False, *,
                     timeout: float | None = None,
                     on_progress: Callable[[pb.WarmupStatus], None] | None = None
                     ) -> pb.WarmupReport:
        request = pb.MixedWarmupRequest(num_tokens=num_tokens, force=force)
        return self._unary(self._warmup.MixedWarmup, request, timeout, on_progress)

    def _unary(self, method: Any, request: Any, timeout: float | None,
               on_progress: Callable[[pb.WarmupStatus], None] | None) -> Any:
        if on_progress is None:
            return _call(lambda: method(request, timeout=self._timeout(timeout),
                                        metadata=self._metadata))
        # The call runs as a future while this thread follows WatchStatus; the call's end
        # cancels the watch, which ends the loop.
        future = method.future(request, timeout=self._timeout(timeout),
                               metadata=self._metadata)
        watch = self._warmup.WatchStatus(pb.WatchStatusRequest(follow=True),
                                         metadata=self._metadata)
        future.add_done_callback(lambda _f: watch.cancel())
        try:
            for status in watch:
                on_progress(status)
        except grpc.RpcError:
            pass  # cancelled by the call's end, or no watch: the call's result decides
        finally:
            watch.cancel()
        return _call(future.result)

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

    def generate(self, prompt_token_ids: Sequence[int] = (), *, timeout: float | None = None,
                 **sampling: Any) -> Iterator[gen_pb.GenerateResponse]:
        """Stream one request's tokens; `sampling` takes generate_request's keywords
        (prompt or messages instead of prompt_token_ids, temperature, top_k, top_p, seed,
        max_tokens, stop_token_ids, ignore_eos, request_id, logprobs, prompt_logprobs, the
        penalties, min_p, min_tokens, logit_bias, and one of json_schema, regex or ebnf for
        structured output).

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
        """Block until health says SERVING, the warmup fails, or `timeout` seconds pass."""
        return self.wait(timeout, service).result

    def wait(self, timeout: float, service: str = "", *,
             server_pid: int | None = None) -> WaitOutcome:
        """wait_ready, also saying what the server last answered (for a timeout's message).

        Each check fails fast while nothing listens (the channel's own reconnect backoff
        paces the retries), so the last connection error can be reported. With `server_pid`
        the process must still run here and the server must report that pid: an answer from
        another process on the same port is WRONG_SERVER, never READY.
        """
        deadline = time.monotonic() + timeout
        last_seen = "no answer yet"
        while (left := deadline - time.monotonic()) > 0:
            try:
                if server_pid is not None:
                    check_process_alive(server_pid)
                serving = self.health(service, timeout=left) == \
                    health_pb2.HealthCheckResponse.SERVING
                if serving and server_pid is None:  # health alone: any gRPC health server
                    return WaitOutcome(WaitResult.READY, "SERVING")
                status = self.get_status(timeout=max(deadline - time.monotonic(), 0.001))
                if server_pid is not None:
                    check_server_pid(status, server_pid)
                if serving:
                    return WaitOutcome(WaitResult.READY, "SERVING")
                if status.state == pb.WARMUP_STATE_FAILED:
                    return WaitOutcome(WaitResult.FAILED, status.failure_reason)
                last_seen = _not_serving(status)
            except ServerIdentityError as exc:
                return WaitOutcome(WaitResult.WRONG_SERVER, str(exc))
            except WarmgateRpcError as exc:
                if exc.code is grpc.StatusCode.DEADLINE_EXCEEDED:
                    break
                if exc.code is not grpc.StatusCode.UNAVAILABLE:  # stopping or restarting
                    raise
                last_seen = f"UNAVAILABLE: {exc.message}"
            time.sleep(max(0.0, min(POLL_INTERVAL_S, deadline - time.monotonic())))
        return WaitOutcome(WaitResult.TIMEOUT, last_seen)

    def check_server(self, server_pid: int, *, timeout: float | None = None) -> None:
        """Raise ServerIdentityError unless process `server_pid` runs and answers here."""
        check_process_alive(server_pid)
        check_server_pid(self.get_status(timeout=timeout), server_pid)

    def wait_answering(self, timeout: float) -> WaitOutcome:
        """Until the server answers health at all (READY, whatever it says), or TIMEOUT
        with the channel's last error: for commands that need a listening server."""
        deadline = time.monotonic() + timeout
        last_seen = "no answer yet"
        while (left := deadline - time.monotonic()) > 0:
            try:
                status = self.health(timeout=left)
                return WaitOutcome(WaitResult.READY,
                                   health_pb2.HealthCheckResponse.ServingStatus.Name(status))
            except WarmgateRpcError as exc:
                if exc.code is grpc.StatusCode.DEADLINE_EXCEEDED:
                    break
                if exc.code is not grpc.StatusCode.UNAVAILABLE:
                    raise
                last_seen = f"UNAVAILABLE: {exc.message}"
            time.sleep(max(0.0, min(POLL_INTERVAL_S, deadline - time.monotonic())))
        return WaitOutcome(WaitResult.TIMEOUT, last_seen)
