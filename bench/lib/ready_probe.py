"""One `warmgate-server` process timed from its start to health SERVING, with its log timeline
(warmgate.server.devtools.ready_log reads the figures from it). The process is the shared
harness's (devtools.server_process); this adds only the health polling."""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from warmgate.server.devtools.ready_log import ReadyRun
from warmgate.server.devtools.server_process import ServerProcess

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


def run_to_ready(argv: Sequence[str], env: Mapping[str, str], timeout_s: float,
                 roots: Sequence[str] | None = None) -> ReadyRun:
    """Start the server (with exactly `env`; argv needs --health-port), poll health until
    SERVING, stop it (SIGTERM); the ready time and log. `roots`: the client and server
    folders it imports warmgate from (default: the ones this process imports).

    Raises RuntimeError with the log's tail if it exits or does not get ready in time.
    """
    server = ServerProcess(argv, env, device=None, start_timeout_s=timeout_s,
                           stop_signal=signal.SIGTERM, inherit_env=False, roots=roots)
    ready_s = None
    try:
        with server:
            while server.elapsed() < timeout_s and server.proc.poll() is None:
                if _healthy(server.health_port):
                    ready_s = server.elapsed()
                    break
                time.sleep(POLL_S)
    except AssertionError:  # the port never showed: it exited or hung during start-up
        pass
    if ready_s is None:
        tail = "\n".join(line for _, line in server.timeline()[-30:])
        raise RuntimeError(f"server not SERVING (exit code {server.proc.poll()}) after "
                           f"{server.elapsed():.1f} s:\n{tail}")
    return ReadyRun(ready_s=ready_s, lines=server.timeline())
