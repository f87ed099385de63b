"""The thin client as a user outside this repository installs it: the wheel `python -m build`
makes, installed with its declared dependencies into a fresh virtual environment, runs
`warmgate --help` there with no torch importable; `warmgate-server` from that install says in
one line which extra it lacks.

The install reaches PyPI for grpcio and protobuf (README.md says so beside the test command);
pip's cache for it lives in the system temp directory, so a second run downloads nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from tests.bench_harness import ROOT

PIP_CACHE = Path(tempfile.gettempdir()) / "warmgate-test-pip-cache"


def clean_env() -> dict[str, str]:
    """The user's environment without this checkout on PYTHONPATH, pip's cache in temp."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PIP_CACHE_DIR=str(PIP_CACHE), PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def run(*argv: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], env=clean_env(), cwd=tempfile.gettempdir(),
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.slow
def test_the_client_wheel_installs_and_runs_without_torch(tmp_path: Path) -> None:
    built = run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                tmp_path / "dist", ROOT)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("warmgate-*-py3-none-any.whl")
    version = wheel.name.split("-")[1]
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(next(n for n in zf.namelist() if n.endswith("/METADATA"))).decode()
    base = [line for line in metadata.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert base and not any("torch" in line for line in base), base

    venv = tmp_path / "venv"
    # Without pip of its own (ensurepip is the slow part); this interpreter's pip installs
    # into it, resolving every dependency the wheel declares (no --no-deps).
    made = run(sys.executable, "-m", "venv", "--without-pip", venv)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    installed = run(sys.executable, "-m", "pip", "--python", python, "install", "-q", wheel)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]

    no_torch = run(python, "-c", "import torch")
    assert "No module named 'torch'" in no_torch.stderr, no_torch.stderr
    helped = run(venv / "bin" / "warmgate", "--help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: warmgate") and "generate" in helped.stdout
    server = run(venv / "bin" / "warmgate-server", "--model", "tiny", "--port", "0", timeout=60)
    assert (server.returncode, server.stdout) == (2, ""), server.stderr
    assert server.stderr.splitlines() == [
        "warmgate-server: the server's dependencies are not installed (no module named "
        f"'torch'); install warmgate with its [server] extra: pip install "
        f"'warmgate-{version}-py3-none-any.whl[server]' (the wheel `python -m build` makes), "
        "or in a checkout pip install -e '.[server]'"]
