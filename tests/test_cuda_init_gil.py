"""bench/start.py cuda-init-gil: one variant's process prints its JSON line; on the CPU only the
workload alone runs (the other two need CUDA)."""

from __future__ import annotations

import json

from tests.bench_harness import run_bench


def test_the_workload_alone_prints_its_wall_time_and_no_stalls() -> None:
    proc = run_bench("bench/start.py cuda-init-gil", ["none"])
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout.splitlines()[-1])
    assert line["variant"] == "none" and line["workload_s"] > 0
    assert "cuda_s" not in line and line["join_wait_s"] == 0.0


def test_an_unknown_variant_is_refused() -> None:
    proc = run_bench("bench/start.py cuda-init-gil", ["cudnn"])
    assert proc.returncode == 1 and "usage:" in proc.stderr
