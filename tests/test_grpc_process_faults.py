"""`warmgate-server` processes under faults: a fatal CUDA error exits 70, SIGTERM drains
and exits 0, and probes on the plaintext health port see NOT_SERVING in both cases."""

from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import Future

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from warmgate.client.api import WaitResult, WarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.server.devtools.server_process import ServerProcess
from warmgate.v1 import warmup_pb2 as pb

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
GRACE_S = 5.0


def _in_thread(fn: object) -> Future[object]:
    """Run a blocking call beside the test; its result or exception lands in the future."""
    future: Future[object] = Future()

    def target() -> None:
        try:
            future.set_result(fn())  # type: ignore[operator]
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=target, daemon=True).start()
    return future


def test_a_fatal_cuda_error_turns_liveness_not_serving_and_exits_70() -> None:
    flags = ["--no-warmup-on-start", "--health-port", "0", "--shutdown-grace", str(GRACE_S)]
    env = {"WARMGATE_FAULT_INJECT": "kernels.decode:cuda_fatal"}
    with ServerProcess(flags, env) as p, \
            grpc.insecure_channel(f"127.0.0.1:{p.health_port}") as probe:
        health = health_pb2_grpc.HealthStub(probe)
        watch = health.Watch(health_pb2.HealthCheckRequest(service="liveness"), timeout=60)
        assert next(watch).status == SERVING
        with WarmgateClient(f"127.0.0.1:{p.port}", timeout=60) as client:
            report = client.warmup_kernels()  # in flight when the error strikes: answered
        assert report.outcome == pb.WARMUP_OUTCOME_FAILED
        decode = next(ph for ph in report.phases if ph.name == "kernels.decode")
        assert "fatal CUDA error" in decode.detail
        assert next(watch).status == NOT_SERVING  # the liveness probe fails: restart
        code = p.wait_exit(GRACE_S + 10)
        log = p.log()
    assert code == 70, log
    assert "illegal memory access" in log and "stopped (exit code 70)" in log


def _draining(client: WarmgateClient) -> bool:
    """GetStatus names the drain; once the main port stops taking new calls (refused, or
    cancelled when one races the stop, while in-flight RPCs finish), the drain has begun too."""
    try:
        return client.get_status().not_serving_reason == "the server is shutting down"
    except WarmgateRpcError as exc:
        assert exc.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), exc
        return True


def test_sigterm_goes_not_serving_at_once_drains_the_warmup_and_exits_0() -> None:
    flags = ["--health-port", "0", "--shutdown-grace", str(GRACE_S)]
    env = {"WARMGATE_FAULT_INJECT": "kernels.decode:delay=1.5"}  # holds every plan open
    with ServerProcess(flags, env) as p, \
            grpc.insecure_channel(f"127.0.0.1:{p.health_port}") as probe, \
            WarmgateClient(f"127.0.0.1:{p.port}", timeout=30) as client:
        assert client.wait_ready(30) is WaitResult.READY  # the start-up plan, delayed too
        forced = _in_thread(lambda: client.warmup_kernels(force=True))
        # Held in decode's first step: progress still names the finished prefill until then.
        deadline = time.monotonic() + 10
        while (st := client.get_status()).state != pb.WARMUP_STATE_RUNNING or \
                st.current_phase != "kernels.prefill":
            assert time.monotonic() < deadline, st
            time.sleep(0.01)
        check = health_pb2_grpc.HealthStub(probe).Check
        request = health_pb2.HealthCheckRequest(service="")
        # A re-warmup preempts serving: not ready until it ends.
        assert check(request, timeout=1).status == NOT_SERVING
        assert "RUNNING" in client.get_status().not_serving_reason
        sent = time.monotonic()
        p.proc.send_signal(signal.SIGTERM)
        while not _draining(client):
            assert time.monotonic() - sent < 1.0, "the drain did not begin at once"
            time.sleep(0.01)
        assert check(request, timeout=1).status == NOT_SERVING
        not_serving_after = time.monotonic() - sent
        # The warmup in flight is stopped at its next step and answered, not cut off.
        error = forced.exception(timeout=GRACE_S + 5)
        assert isinstance(error, WarmgateRpcError), error
        assert error.code is grpc.StatusCode.UNAVAILABLE and "shutting down" in error.message
        code = p.wait_exit(GRACE_S + 5)
        exited_after = time.monotonic() - sent
        log = p.log()
    assert code == 0, log
    print(f"NOT_SERVING after {not_serving_after:.3f} s, exit 0 after {exited_after:.3f} s")
    assert not_serving_after < 1.0 and exited_after < GRACE_S, (not_serving_after, exited_after)
    assert "stopped (exit code 0)" in log
