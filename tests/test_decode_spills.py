"""The decode kernel's in-kernel split merge and rotation in the binaries, without a GPU:
compiled for sm_90 at every preset's query rows, GQA group, head size and q/k norm (k 0 and 3;
tests/decode_spill_probe.py),
the decode kernel spills no register to local memory and, at 16 query rows, keeps within 128
registers a thread (four programs of 128 threads an SM). A change to the kernel or its merge
that costs more registers than that fails here, where on a GPU it would only be slower."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from warmgate.server.config.runner_config import preset_names

ROOT = Path(__file__).resolve().parents[1]


def test_the_decode_kernel_with_its_merge_spills_nothing_for_any_preset() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(str(ROOT / p) for p in ("", "client", "server"))
    proc = subprocess.run([sys.executable, "-m", "tests.decode_spill_probe"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    reports = [json.loads(line) for line in proc.stdout.splitlines()]
    covered = {p for r in reports for p in r["presets"]}
    assert covered == {f"{name} k{k}" for name in preset_names() for k in (0, 3)}
    for r in reports:
        assert r["MERGE"] and r["ROPE"] and r["STACK"] == 0, r
        assert r["BLOCK_M"] > 16 or r["REG"] <= 128, r
