"""Programmatic dependent launch in the binaries, without a GPU: every kernel the PDL launch
sites launch with the switch on, compiled for sm_90 as those sites launch it (tests/
pdl_ptx_probe.py), is built with launch_pdl, executes griddepcontrol.wait and
griddepcontrol.launch_dependents, and before the wait stores nothing and loads only its
weights (the GEMV's first weight tile, the RMSNorm weight): a kernel launched early that read
a previous kernel's output, or overwrote its input, before the wait would race."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from tests.pdl_sites import CONVERTED

ROOT = Path(__file__).resolve().parents[1]


def test_every_pdl_kernel_waits_before_touching_what_another_kernel_wrote() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(str(ROOT / p) for p in ("", "client", "server"))
    proc = subprocess.run([sys.executable, "-m", "tests.pdl_ptx_probe"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    reports = [json.loads(line) for line in proc.stdout.splitlines()]
    assert {r["kernel"] for r in reports} == {name for _, name in CONVERTED}
    for r in reports:
        assert r["launch_pdl"] and r["wait"] and r["release"] and not r["problems"], r
