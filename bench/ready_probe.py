"""One `warmgate-server` process timed from its start to health SERVING, with its log timeline
(warmgate.server.devtools.ready_log reads the figures from it)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from warmgate.server.devtools.ready_log import HEALTH_PORT, ReadyRun

POLL_S = 0.02
SERVING = health_pb2.HealthCheckResponse.SERVING


def _healthy(port: int) -> bool:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0)
        except grpc.RpcError:
            return False
    return reply.status == SERVING


def run_to_ready(argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> ReadyRun:
    """Start the server (with exactly `env`), poll health until SERVING, stop it (SIGTERM);
    the ready time and log.

    Raises RuntimeError with the log's tail if it exits or does not get ready in time.
    """
    run = ReadyRun(ready_s=0.0)
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "warmgate.server.main", *argv],
                            env=dict(env), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)

    def read() -> None:
        assert proc.stderr is not None  # stderr=PIPE
        for line in proc.stderr:
            run.lines.append((time.monotonic() - start, line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        port = None
        while time.monotonic() - start < timeout_s:
            if proc.poll() is not None:
                break
            if port is None and (hit := run.first(HEALTH_PORT)) is not None:
                port = int(hit[1].group(1))
            if port is not None and _healthy(port):
                run.ready_s = time.monotonic() - start
                return run
            time.sleep(POLL_S)
        if proc.poll() is not None:
            reader.join(10)  # the last lines, the reason among them
        tail = "\n".join(line for _, line in run.lines[-30:])
        raise RuntimeError(f"server not SERVING (exit code {proc.poll()}) after "
                           f"{time.monotonic() - start:.1f} s:\n{tail}")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        reader.join(10)
