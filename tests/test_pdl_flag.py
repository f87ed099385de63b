"""--pdl (programmatic dependent launch, kernels/pdl.py): off by default, on with the flag or
WARMGATE_PDL, the flag beating the variable; and refused at start-up, in one line naming the
flag and exit 2, wherever it cannot run: a CPU, a GPU older than compute capability 9.0, the
torch attention backend (no Triton ops to launch), a Triton without the launch option."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runner_helpers import tiny_config
from warmgate.server.config.pdl_support import check_pdl, triton_launches_pdl
from warmgate.server.config.runner_config import ConfigError, RunnerConfig, resolve_runner_config
from warmgate.server.startup import load_server_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("argv", "environ", "expected"), [
    ([], {}, False),
    (["--pdl"], {}, True),
    ([], {"WARMGATE_PDL": "1"}, True),
    (["--no-pdl"], {"WARMGATE_PDL": "true"}, False),
    (["--pdl"], {"WARMGATE_PDL": "0"}, True),
], ids=["default", "flag", "env", "no-flag-beats-env", "flag-beats-env"])
def test_the_flag_and_its_variable(argv: list[str], environ: dict[str, str],
                                   expected: bool) -> None:
    config = load_server_config(["--device", "cpu", *argv], environ=environ, resolve=False)
    assert config.runner.compilation.pdl is expected


def test_it_is_part_of_the_runner_config_hash() -> None:
    base = tiny_config()
    on = dataclasses.replace(base, compilation=dataclasses.replace(base.compilation, pdl=True))
    assert on.config_hash() != base.config_hash()  # other kernels: another compile cache entry


def test_a_cpu_start_refuses_it_in_one_line_naming_the_flag(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        load_server_config(["--device", "cpu", "--pdl"], environ={})
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "argument --pdl:" in lines[0] and "--device is cpu" in lines[0]


def test_the_server_process_exits_2_naming_the_flag() -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("WARMGATE_") and k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "client"), str(ROOT / "server")])
    proc = subprocess.run(
        [sys.executable, "-m", "warmgate.server.main", "--host", "127.0.0.1", "--port", "0",
         "--device", "cpu"],
        env={**env, "WARMGATE_PDL": "1", "WARMGATE_METRICS_PORT": "-1"},
        capture_output=True, text=True, timeout=120, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "argument --pdl:" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def _cuda(backend: str) -> RunnerConfig:
    base = tiny_config()
    return dataclasses.replace(
        base, device=dataclasses.replace(base.device, device="cuda", dtype="auto",
                                         attention_backend=backend),
        compilation=dataclasses.replace(base.compilation, pdl=True))


@pytest.mark.parametrize(("backend", "capability", "triton_ok", "says"), [
    ("triton", (8, 0), True, "cuda is 8.0"),
    ("triton", (8, 9), True, "cuda is 8.9"),
    ("torch", (9, 0), True, "it is torch"),
    ("flashinfer", (9, 0), False, "no launch_pdl launch option"),
], ids=["a100", "ada", "torch-backend", "old-triton"])
def test_a_device_that_cannot_launch_it_is_refused(backend: str, capability: tuple[int, int],
                                                   triton_ok: bool, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_pdl("cuda", backend, capability, triton_ok=triton_ok)
    assert err.value.field_name == "compilation.pdl" and says in err.value.message


def test_hopper_with_the_triton_ops_resolves() -> None:
    pytest.importorskip("triton")
    check_pdl("cuda", "triton", (9, 0), triton_ok=True)
    check_pdl("cuda:1", "flashinfer", (10, 0), triton_ok=True)
    with pytest.raises(ConfigError, match=r"cuda is 8\.9"):
        resolve_runner_config(_cuda("triton"), cuda_available=True, cuda_capability=(8, 9))
    resolved = resolve_runner_config(_cuda("triton"), cuda_available=True,
                                     cuda_capability=(9, 0))
    assert resolved.compilation.pdl and resolved.is_resolved
    with pytest.raises(ConfigError, match="--device is cpu"):
        check_pdl("cpu", "triton", None)


def test_the_installed_triton_has_the_launch_option() -> None:
    pytest.importorskip("triton")
    assert triton_launches_pdl()  # the project requires triton >= 3.6
