"""The typed packages (pyproject's [tool.mypy] files: core, config, telemetry, warmup, control,
api, startup, main) pass `mypy --strict`, so a broken seam shows up in the test run like any
other failure."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mypy_strict_is_clean() -> None:
    mypy = shutil.which("mypy")
    if mypy is None:
        pytest.skip("mypy is not installed (it comes with the test extra)")
    # The files and flags come from pyproject.toml; the cache (.mypy_cache) makes reruns quick.
    proc = subprocess.run([mypy], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
