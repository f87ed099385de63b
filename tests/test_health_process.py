"""The health process behind --health-port (api/health_process.py): up before the model
server, following its readiness, honest about liveness, gone with its parent."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.grpc_harness import FakeEngine, run, server_config, serving
from warmgate.client.aio import AsyncWarmgateClient
from warmgate.server.api.health_link import HealthLink, HealthPortError
from warmgate.server.core import health_wire as wire
from warmgate.server.devtools.server_process import MAIN_PORT, ServerProcess, source_roots

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
STATUSES = {"": wire.NOT_SERVING, "liveness": wire.SERVING}


def _check(port: int, service: str = "", timeout: float = 5.0) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    return int(reply.status)


def _gone(pid: int, timeout: float) -> bool:
    """The process ended (reaped, or a zombie nobody waited for yet) within timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def link() -> Iterator[HealthLink]:
    link = HealthLink.start("127.0.0.1", 0, STATUSES, liveness="liveness",
                            heartbeat_timeout_s=0.5)
    yield link
    link.close()


def test_health_answers_not_serving_before_the_model_server_is_up() -> None:
    # The load is held for 60 s; the health process is up before the server's start-up checks
    # (which import torch) end, let alone its main port.
    env = {"WARMGATE_FAULT_INJECT": "load:delay=60"}
    with ServerProcess(["--health-port", "0"], env, wait_for_main=False) as p:
        assert _check(p.health_port) == NOT_SERVING
        answered = p.elapsed()
        assert _check(p.health_port, "liveness") == SERVING
        p.wait_for(MAIN_PORT)
        lines = [line for _, line in p.timeline()]
        first = {name: next(i for i, line in enumerate(lines) if pattern in line)
                 for name, pattern in (("health", "warmgate health process"),
                                       ("config", "config_hash="),
                                       ("main", "serving warmgate.v1.Warmup"))}
        print(f"health answered {answered:.2f} s after the start")
        assert first["health"] < first["config"] < first["main"], p.log()


def test_health_port_follows_warmup_and_a_forced_rewarmup_and_watch_streams_it() -> None:
    async def body() -> None:
        async with serving(server_config("--health-port", "0"), engine=FakeEngine()) as s, \
                AsyncWarmgateClient(f"127.0.0.1:{s.port}") as c, \
                grpc.aio.insecure_channel(f"127.0.0.1:{s.health_port}") as probe:
            health = health_pb2_grpc.HealthStub(probe)
            request = health_pb2.HealthCheckRequest(service="")
            watch = health.Watch(request, timeout=30)
            assert (await watch.read()).status == NOT_SERVING
            assert (await health.Check(request, timeout=5)).status == NOT_SERVING
            await c.warmup_kernels()
            assert (await watch.read()).status == SERVING
            assert (await health.Check(request, timeout=5)).status == SERVING
            await c.warmup_kernels(force=True)  # not ready while it runs, ready after
            assert (await watch.read()).status == NOT_SERVING
            assert (await watch.read()).status == SERVING
            unknown = health_pb2.HealthCheckRequest(service="no.such.Service")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await health.Check(unknown, timeout=5)
            assert info.value.code() is grpc.StatusCode.NOT_FOUND
            watch.cancel()

    run(body())


def test_liveness_turns_not_serving_when_heartbeats_stop_and_back_when_they_resume(
        link: HealthLink) -> None:
    for _ in range(5):  # a parent whose loop runs
        link.beat()
        time.sleep(0.1)
    assert _check(link.port, "liveness") == SERVING
    time.sleep(1.5)  # its loop is blocked: no heartbeat for 3 x the timeout
    assert _check(link.port, "liveness") == NOT_SERVING
    assert _check(link.port, "") == NOT_SERVING  # readiness is the parent's, untouched
    link.beat()
    deadline = time.monotonic() + 5
    while _check(link.port, "liveness") != SERVING:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_pushed_statuses_are_answered_and_calls_are_counted(link: HealthLink) -> None:
    counted: list[tuple[str, str, int]] = []
    link.on_count = lambda method, code, n: counted.append((method, code, n))
    link.set("", wire.SERVING)
    link.set("extra", wire.NOT_SERVING)
    deadline = time.monotonic() + 5
    while _check(link.port, "") != SERVING:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert _check(link.port, "extra") == NOT_SERVING
    deadline = time.monotonic() + 5
    while sum(n for m, code, n in counted if code == "OK") < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert {m for m, _, _ in counted} == {"/grpc.health.v1.Health/Check"}


def test_a_busy_health_port_is_one_line_naming_the_flag_and_the_address(
        capfd: pytest.CaptureFixture[str]) -> None:
    # The port taken after main's own check: the health process's bind report says so.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(HealthPortError) as info:
            HealthLink.start("127.0.0.1", port, STATUSES, liveness="liveness")
    message = str(info.value)
    assert message.startswith(f"argument --health-port: cannot bind 127.0.0.1:{port}: ")
    assert "\n" not in message
    assert capfd.readouterr().err == ""  # no gRPC C-core lines from the child either


def test_warmgate_server_with_a_busy_health_port_exits_2_with_one_line() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(source_roots())}
        proc = subprocess.run([sys.executable, "-m", "warmgate.server.main", "--host",
                               "127.0.0.1", "--port", "0", "--device", "cpu",
                               "--health-port", str(port)], env=env, capture_output=True,
                              text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"warmgate-server: error: argument --health-port: cannot bind 127.0.0.1:{port}: "
        "Address already in use (another process holds it)"], proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_health_process_ends_with_the_server(sig: signal.Signals) -> None:
    with ServerProcess(["--health-port", "0", "--shutdown-grace", "1"],
                       stop_signal=sig) as p:
        child = p.health_pid()
        assert _check(p.health_port, "liveness") == SERVING
        assert not _gone(child, 0)
    # ServerProcess's exit sent `sig` and waited for the server.
    assert _gone(child, 5), f"health process {child} outlived its server"


FORKING_PARENT = textwrap.dedent("""
    import os, sys, time
    from warmgate.server.api.health_link import HealthLink
    link = HealthLink.start("127.0.0.1", 0, {"": 2}, liveness="liveness")
    if os.fork() == 0:  # a grandchild holding the parent's socket: no end of file for it
        time.sleep(60)
        os._exit(0)
    print(link.proc.pid, flush=True)
    time.sleep(60)
""")


def test_the_health_process_dies_with_a_killed_parent_even_if_its_socket_lives_on() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(source_roots())}
    parent = subprocess.Popen([sys.executable, "-c", FORKING_PARENT], env=env,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert not _gone(child, 0.3)
        parent.kill()
        parent.wait()
        assert _gone(child, 5), "PR_SET_PDEATHSIG did not end the health process"
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the sleeping grandchild


def test_the_health_process_imports_nothing_heavy() -> None:
    code = ("import sys, warmgate.server.api.health_process; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('warmgate') "
            "or m in ('torch', 'numpy', 'prometheus_client'))))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(source_roots())}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert set(out) <= {"warmgate", "warmgate.server", "warmgate.server.api",
                        "warmgate.server.api.grpc_options", "warmgate.server.api.health_process",
                        "warmgate.server.api.port_check", "warmgate.server.core.stream_cap",
                        "warmgate.server.core", "warmgate.server.core.health_wire"}, out


def test_the_drain_keeps_liveness_serving_on_the_health_port() -> None:
    async def body() -> None:
        async with serving(server_config("--health-port", "0"), engine=FakeEngine()) as s:
            await s.health.drain()
            await asyncio.sleep(0.2)
            assert _check(s.health_port, "") == NOT_SERVING
            assert _check(s.health_port, "liveness") == SERVING

    run(body())



def test_a_watch_gets_the_last_status_its_parent_set_before_the_parent_left() -> None:
    """The drain's NOT_SERVING, set just before the parent closes the link (its last act on
    the way out), reaches a Watch before the health process ends; ten times over, since the
    end of file can follow the set within the same read."""

    async def last_status_seen() -> int:
        link = HealthLink.start("127.0.0.1", 0, {"": wire.SERVING}, liveness="liveness")
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{link.port}") as channel:
                watch = health_pb2_grpc.HealthStub(channel).Watch(
                    health_pb2.HealthCheckRequest(service=""), timeout=10)
                assert (await watch.read()).status == SERVING
                link.set("", wire.NOT_SERVING)
                link.close()
                return int((await watch.read()).status)
        finally:
            link.close()

    for _ in range(10):
        assert run(last_status_seen()) == NOT_SERVING
