"""Grammar compiles against a `warmgate-server` process: SIGTERM with heavy compiles in
flight, in the probes or in the engine process's build, exits within --shutdown-grace + 2 s
(the probes killed, the build not waited for), a cancelled request's compile stops, and the
RSS of the server and its engine process after 12 distinct heavy schemas grows less than
--grammar-cache-mib."""

from __future__ import annotations

import contextlib
import re
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import grpc
import psutil
import pytest

from tests.test_grammar_compiles import patterned_schema
from tests.test_grpc_structured import EOS
from tests.text_helpers import write_tiny_model
from warmgate.client.api import WarmgateClient
from warmgate.client.errors import WarmgateRpcError
from warmgate.server.devtools.server_process import ServerProcess
from warmgate.server.serving.grammar.probe_zygote import WORKER_MODULE

ENGINE_MODULE = "warmgate.server.engine_main"
GRACE_S = 1.0
CACHE_MIB = 40
PROBE_KILLED = re.compile(r"grammar compile probe (\d+) killed mid-compile")
PROBE_READY = re.compile(r"grammar compile probe (\d+) ready in")
ENGINE_BUILD_STARTED = re.compile(r"\[engine\] \S+: grammar build started: json_schema")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-grammar-process"), eos_token_id=EOS)


def _probes(server_pid: int) -> list[psutil.Process]:
    """The probes' zygote (the server's child) and the probes it forked, killed ones whose
    exit the zygote has not collected yet left out."""
    found = []
    for p in psutil.Process(server_pid).children(recursive=True):
        with contextlib.suppress(psutil.ZombieProcess, psutil.NoSuchProcess):
            if WORKER_MODULE in " ".join(p.cmdline()):
                found.append(p)
    return found


def _wait_probes(p: ServerProcess, count: int, timeout_s: float = 60.0) -> list[int]:
    """The probe processes' pids, once `count` of them said they are ready."""
    deadline = time.monotonic() + timeout_s
    while len(ready := PROBE_READY.findall(p.log())) < count:
        assert time.monotonic() < deadline, "the compile probes did not start"
        time.sleep(0.1)
    pids = [int(pid) for pid in ready]
    assert set(pids) <= {q.pid for q in _probes(p.proc.pid)}
    return pids


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
def test_sigterm_with_heavy_compiles_in_flight_exits_within_the_grace(model_dir: Path
                                                                     ) -> None:
    flags = ["--model", str(model_dir), "--shutdown-grace", str(GRACE_S),
             "--grammar-compile-timeout", "300"]
    with ServerProcess(flags, stop_signal=signal.SIGTERM) as p, \
            WarmgateClient(p.target, timeout=120) as client, ThreadPoolExecutor(4) as pool:
        client.wait_ready(120)
        probes = _wait_probes(p, 2)
        # A request that gives up (its deadline) takes its compile with it.
        with pytest.raises(WarmgateRpcError) as info:
            list(client.generate([1, 2, 3], json_schema=patterned_schema(salt="gone"),
                                 timeout=2.0))
        assert info.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
        killed = int(p.wait_for(PROBE_KILLED, 10).group(1))
        assert killed in probes
        deadline = time.monotonic() + 5
        while not _gone(killed):
            assert time.monotonic() < deadline, "the cancelled compile's probe lives on"
            time.sleep(0.05)
        # Two heavy compiles (about 8 s each) in flight, then SIGTERM.
        heavy: list[Future[object]] = [
            pool.submit(lambda salt=salt: list(client.generate(
                [1, 2, 3], json_schema=patterned_schema(salt=salt))))
            for salt in ("a", "b")]
        time.sleep(1.5)
        assert not any(f.done() for f in heavy)
        in_flight = [q.pid for q in _probes(p.proc.pid)]
        sent = time.monotonic()
        p.proc.send_signal(signal.SIGTERM)
        code = p.wait_exit(GRACE_S + 10)
        exited_after = time.monotonic() - sent
        for future in heavy:
            error = future.exception(timeout=10)
            assert isinstance(error, WarmgateRpcError), error
            assert error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), error
        log = p.log()
    print(f"exit {code} {exited_after:.2f} s after SIGTERM with 2 compiles in flight")
    assert code == 0, log
    assert exited_after < GRACE_S + 2.0, (exited_after, log)
    assert "stopped (exit code 0)" in log
    assert all(_gone(pid) for pid in in_flight)


@pytest.mark.slow
def test_sigterm_during_the_engines_build_of_a_grammar_exits_within_the_grace(
        model_dir: Path) -> None:
    """The grammar passed its probe (about 4 s of compile under a 120 s budget) and the
    engine process builds it: its reader thread, which builds nothing, reads the end of file
    at once. It used to build there, and the stop waited for the build."""
    flags = ["--model", str(model_dir), "--shutdown-grace", str(GRACE_S),
             "--grammar-compile-timeout", "120"]
    with ServerProcess(flags, stop_signal=signal.SIGTERM) as p, \
            WarmgateClient(p.target, timeout=120) as client, ThreadPoolExecutor(1) as pool:
        client.wait_ready(120)
        _wait_probes(p, 2)
        request = pool.submit(lambda: list(client.generate(
            [1, 2, 3], max_tokens=2, json_schema=patterned_schema(60, salt="engine"))))
        p.wait_for(ENGINE_BUILD_STARTED, 60)
        sent = time.monotonic()
        p.proc.send_signal(signal.SIGTERM)
        code = p.wait_exit(GRACE_S + 10)
        exited_after = time.monotonic() - sent
        error = request.exception(timeout=10)
        log = p.log()
    print(f"exit {code} {exited_after:.2f} s after SIGTERM during the engine's build")
    assert isinstance(error, WarmgateRpcError), error
    assert error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), error
    assert code == 0, log
    assert exited_after < GRACE_S + 2.0, (exited_after, log)


def _serving_rss_mib(p: ServerProcess) -> float:
    """The resident memory of the server and of its engine process, where the grammars are
    built and cached when it is on (the probes' processes come and go with their compiles)."""
    server = psutil.Process(p.proc.pid)
    engines = [c for c in server.children() if ENGINE_MODULE in " ".join(c.cmdline())]
    return sum(proc.memory_info().rss for proc in (server, *engines)) / (1 << 20)


@pytest.mark.slow
def test_rss_after_twelve_distinct_heavy_schemas_grows_less_than_the_cache_budget(
        model_dir: Path) -> None:
    """With the engine process (the default), which builds and caches the grammars."""
    flags = ["--model", str(model_dir), "--grammar-cache-mib", str(CACHE_MIB),
             "--grammar-compile-timeout", "120"]
    with ServerProcess(flags) as p, WarmgateClient(p.target, timeout=120) as client:
        client.wait_ready(120)
        # One schema first, so that what every compile allocates once is in the baseline.
        list(client.generate([1, 2, 3], json_schema=patterned_schema(60, "[a-z]{1,20}",
                                                                     salt="base"),
                             max_tokens=2))
        before = _serving_rss_mib(p)
        for i in range(12):
            # About 10 MiB each as xgrammar counts (the 55 MB on SmolLM2).
            list(client.generate([1, 2, 3], max_tokens=2, json_schema=patterned_schema(
                60, "([a-z]{1,20}[0-9]{1,20}){1,10}", salt=f"s{i}")))
        grown = _serving_rss_mib(p) - before
        log = p.log()
    print(f"RSS +{grown:.1f} MiB after 12 distinct schemas, cache budget {CACHE_MIB} MiB")
    assert len(re.findall(r"grammar compiled: json_schema", log)) == 13
    assert len(re.findall(r"grammar built: json_schema", log)) == 13
    assert grown < CACHE_MIB, log[-3000:]
