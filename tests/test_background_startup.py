"""control/background_startup.py: the CUDA context and the weights' read-ahead begun before
the servers bind, and a server whose model load is still running answers health NOT_SERVING."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.control import background_startup as startup
from warmgate.server.control.background_startup import (
    BackgroundStartup,
    begin_background_startup,
    begin_cuda_context,
    context_device,
    requested_device,
)
from warmgate.server.devtools.checkpoint import write_checkpoint
from warmgate.server.devtools.server_process import ServerProcess

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny")
    write_checkpoint("tiny", directory, "cpu", "float32")
    return directory


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == startup.__name__]


def _config(model: str, device: str) -> RunnerConfig:
    from warmgate.server.startup import load_server_config

    return load_server_config(["--model", model, "--device", device]).runner


def test_cpu_device_reads_ahead_and_creates_no_context(
        tiny_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=startup.__name__)
    background = begin_background_startup(_config(str(tiny_dir), "cpu"))
    background.logging_ready()
    background.join(30)
    lines = _lines(caplog)
    assert lines[0] == "start-up: in the background: read-ahead of 1 weight files"
    size = sum(p.stat().st_size for p in tiny_dir.glob("*.safetensors"))
    assert re.fullmatch(rf"start-up: read-ahead of 1 weight files \({size / 1e9:.2f} GB\) "
                        r"requested in [\d.]+ s", lines[1])


def test_a_preset_on_cpu_starts_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=startup.__name__)
    background = begin_background_startup(_config("tiny", "cpu"))
    background.logging_ready()
    background.join(30)
    assert _lines(caplog) == ["start-up: in the background: nothing (no CUDA device, no "
                              "weight files)"]


def test_cuda_without_a_gpu_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert startup.create_cuda_context("cuda:0") == (
        "start-up: no CUDA device for --device cuda:0; no context created in the background")
    assert startup.wants_cuda("auto") and startup.wants_cuda("cuda:1")
    assert not startup.wants_cuda("cpu")


def test_a_failed_context_is_left_to_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    line = startup.create_cuda_context("cuda:0")  # no CUDA in this build: zeros raises
    assert line.startswith("start-up: CUDA context on cuda:0 failed in the background after ")
    assert line.endswith("the model load will report it")


def test_a_read_ahead_that_cannot_open_a_file_says_so(tmp_path: Path) -> None:
    line = startup.read_ahead([tmp_path / "gone.safetensors"])
    assert re.search(r"read-ahead stopped after .*FileNotFoundError.*the model load will "
                     r"report it", line), line


def test_lines_wait_for_logging(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=startup.__name__)
    release = threading.Event()
    background = BackgroundStartup()
    background.start("early", "early work", lambda: "early finished")
    background.start("late", "late work", lambda: (release.wait(10), "late finished")[1])
    background._threads[0].join(10)
    assert _lines(caplog) == []  # before basicConfig a line would be lost
    background.logging_ready()
    assert _lines(caplog) == ["start-up: in the background: early work, late work",
                              "early finished"]
    release.set()
    background.join(10)
    assert _lines(caplog)[-1] == "late finished"
    assert not any(t.daemon for t in background._threads)


def test_health_answers_not_serving_while_the_model_loads(tiny_dir: Path) -> None:
    # The load is held for 60 s: the health port has to answer during it, not after.
    flags = ["--model", str(tiny_dir), "--health-port", "0"]
    with ServerProcess(flags, {"WARMGATE_FAULT_INJECT": "load:delay=60"}) as p:
        with grpc.insecure_channel(f"127.0.0.1:{p.health_port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert reply.status == NOT_SERVING
        log = p.log()
        assert "start-up: in the background: read-ahead of 1 weight files" in log
        assert "weights read:" not in log  # the load had not got there


# main with a fake CUDA context: what had been imported when the context's thread started.
ORDER = """
import json, sys
from warmgate.server.control import background_startup as bs
seen = []
real_start = bs.BackgroundStartup.start
def start(self, name, what, work):
    if name == "cuda":
        seen.append({m: m in sys.modules for m in (
            "torch", "warmgate.server.app", "warmgate.server.warmup.shapes",
            "warmgate.server.runner.model_runner", "jinja2")})
    real_start(self, name, what, lambda: "start-up: fake CUDA context")
bs.BackgroundStartup.start = start
from warmgate.server.main import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    print(json.dumps({"code": exc.code, "seen": seen}))
"""


def _order(*argv: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMGATE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "client"), str(ROOT / "server")])
    proc = subprocess.run([sys.executable, "-c", ORDER, *argv], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_main_starts_the_cuda_context_right_after_torch_before_the_server(
        tmp_path: Path) -> None:
    # A model directory that is not there: the full configuration check, after the early
    # start, exits 2 (on a CPU machine and on a GPU one alike).
    out = _order("--model", str(tmp_path / "missing"), "--device", "cuda:0",
                 "--no-engine-process")
    assert out["code"] == 2
    assert out["seen"] == [{"torch": True, "warmgate.server.app": False,
                            "warmgate.server.warmup.shapes": False,
                            "warmgate.server.runner.model_runner": False, "jinja2": False}]
    # With the engine process (the default) the device is the engine's: no context here.
    assert _order("--model", str(tmp_path / "missing"), "--device", "cuda:0") == \
        {"code": 2, "seen": []}


def test_main_on_the_cpu_or_asking_for_help_starts_no_context_and_no_torch() -> None:
    assert _order("--help") == {"code": 0, "seen": []}
    code = ("import sys\nfrom warmgate.server.main import main\ntry:\n    main(['--help'])\n"
            "except SystemExit as e:\n    assert e.code == 0\nprint('torch' in sys.modules)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "client"),
                                                        str(ROOT / "server")])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    assert proc.stdout.strip().splitlines()[-1] == "False"
    assert begin_cuda_context("cpu").names == []
    assert requested_device(["--device", "cuda:1"], {}) == "cuda:1"
    assert requested_device([], {"WARMGATE_DEVICE": "cpu"}) == "cpu"
    assert requested_device([], {}) == "auto"
    # The engine process owns the device: the server process starts no CUDA context.
    assert context_device(["--device", "cuda:1"], {}) == "cpu"
    assert context_device(["--device", "cuda:1", "--no-engine-process"], {}) == "cuda:1"
    assert context_device(["--device", "cuda:1", "--warmup-only"], {}) == "cuda:1"


def test_an_early_context_is_not_started_twice(tiny_dir: Path) -> None:
    from warmgate.server.startup import load_server_config

    config = load_server_config(["--model", str(tiny_dir), "--device", "cuda"],
                                resolve=False).runner
    early = BackgroundStartup()
    early.start("cuda", "CUDA context (cuda)", lambda: "start-up: fake CUDA context")
    background = begin_background_startup(config, early)
    background.join(30)
    assert background is early and background.names == ["cuda", "readahead"]


# main with a fake CUDA context: which began first, the health process or the context.
HEALTH_FIRST = """
import json, sys
from warmgate.server.api import health_link as hl
from warmgate.server.control import background_startup as bs
events = []
real_init, real_start = hl.PendingHealthLink.__init__, bs.BackgroundStartup.start
def init(self, *args, **kwargs):
    events.append("health process (torch imported: %s)" % ("torch" in sys.modules))
    real_init(self, *args, **kwargs)
def start(self, name, what, work):
    events.append(name)
    real_start(self, name, what, lambda: "start-up: fake CUDA context")
hl.PendingHealthLink.__init__, bs.BackgroundStartup.start = init, start
from warmgate.server.main import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    print(json.dumps({"code": exc.code, "events": events}))
"""


def test_main_starts_the_health_process_before_it_imports_torch(tmp_path: Path) -> None:
    # The health process binds while torch imports: probes get NOT_SERVING from the start.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMGATE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "client"), str(ROOT / "server")])
    proc = subprocess.run([sys.executable, "-c", HEALTH_FIRST, "--model",
                           str(tmp_path / "missing"), "--device", "cuda:0",
                           "--no-engine-process", "--health-port",
                           "0", "--port", "0", "--metrics-port", "-1"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"code": 2, "events": ["health process (torch imported: False)", "cuda"]}
