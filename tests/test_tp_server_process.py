"""`warmgate-server --tensor-parallel-size 2` on the CPU, a real process with its worker:
SERVING once every rank warmed (the `distributed` phase in the log), a worker killed with
SIGKILL turns health NOT_SERVING and the server exits non-zero within 30 s, SIGTERM exits 0
and leaves no worker behind."""

from __future__ import annotations

import os
import re
import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from warmgate.server.devtools.server_process import ServerProcess

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
READY = re.compile(r"warmup outcome=SUCCEEDED")
WORKER_PID = re.compile(r"tensor parallel: started rank 1/2 \(pid (\d+)\)")
# The worker rank freezes its heap on rank 0's word after the warmup (control/heap_freeze.py).
WORKER_FROZEN = re.compile(r"\[rank 1\] .*rank 1: heap frozen after warmup: \d+ objects")
DISTRIBUTED = re.compile(r"phase=distributed status=RAN .*\"rank_seconds\":\[[0-9.e-]+,"
                         r"[0-9.e-]+\]")
FLAGS = ["--tensor-parallel-size", "2", "--health-port", "0", "--shutdown-grace", "2",
         "--max-num-seqs", "2", "--max-num-batched-tokens", "32", "--max-model-len", "64"]
EXIT_DEADLINE_S = 30.0
READY_TIMEOUT_S = 240.0

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def _health(port: int) -> int | None:
    """The readiness status, None once nothing answers."""
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            return health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=5).status
    except grpc.RpcError:
        return None


def _ready(p: ServerProcess) -> int:
    p.wait_for(READY, READY_TIMEOUT_S)
    assert _health(p.health_port) == SERVING
    p.wait_for(DISTRIBUTED, 1)
    p.wait_for(WORKER_FROZEN, 30)
    return int(p.wait_for(WORKER_PID, 1).group(1))


def test_a_killed_worker_fails_health_and_exits_non_zero_within_30s() -> None:
    with ServerProcess(FLAGS) as p, \
            grpc.insecure_channel(f"127.0.0.1:{p.health_port}") as probe:
        worker = _ready(p)
        # A watch sees every change, however short the server lives after it.
        watch = health_pb2_grpc.HealthStub(probe).Watch(
            health_pb2.HealthCheckRequest(service="liveness"), timeout=EXIT_DEADLINE_S + 30)
        assert next(watch).status == SERVING
        os.kill(worker, signal.SIGKILL)
        killed = time.monotonic()
        assert next(watch).status == NOT_SERVING
        code = p.wait_exit(EXIT_DEADLINE_S)
        took = time.monotonic() - killed
        log = p.log()
    assert took < EXIT_DEADLINE_S, log
    assert code != 0, log
    assert "tensor-parallel rank 1" in log and "exited with code -9" in log


def test_sigterm_stops_every_rank() -> None:
    with ServerProcess(FLAGS) as p:
        worker = _ready(p)
        p.proc.send_signal(signal.SIGTERM)
        code = p.wait_exit(EXIT_DEADLINE_S)
        log = p.log()
    assert code == 0, log
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker), f"worker {worker} outlived the server:\n{log}"
