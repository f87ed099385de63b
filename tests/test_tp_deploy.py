""".ci/check_manifests.py on tensor-parallel pods: one GPU per rank and a memory-backed
/dev/shm are required; the repository's gpu-tp2 overlay is rendered and checked with the
other builds by tests/test_deploy_rollout.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".ci"))
from check_manifests import check_tensor_parallel  # noqa: E402


def _pod(gpus: int, shm_medium: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    volumes = [] if shm_medium is None else [{"name": "dshm",
                                              "emptyDir": {"medium": shm_medium}}]
    mounts = [] if shm_medium is None else [{"name": "dshm", "mountPath": "/dev/shm"}]
    spec = {"containers": [{"name": "warmgate", "volumeMounts": mounts}], "volumes": volumes}
    return {"nvidia.com/gpu": gpus}, spec


@pytest.mark.parametrize(("size", "gpus", "medium", "expected"), [
    ("2", 2, "Memory", []),
    ("1", 1, None, []),
    ("4", 2, "Memory", ["WARMGATE_TENSOR_PARALLEL_SIZE=4 but nvidia.com/gpu limit 2"]),
    ("2", 2, "", ["needs /dev/shm on an emptyDir with medium Memory"]),
    ("2", 2, None, ["needs /dev/shm on an emptyDir with medium Memory"]),
])
def test_tensor_parallel_pods(size: str, gpus: int, medium: str | None,
                              expected: list[str]) -> None:
    limits, spec = _pod(gpus, medium)
    problems: list[str] = []
    check_tensor_parallel("Deployment/warmgate", {"WARMGATE_DEVICE": "cuda",
                                                  "WARMGATE_TENSOR_PARALLEL_SIZE": size},
                          limits, spec, problems)
    assert len(problems) == len(expected), problems
    for problem, want in zip(problems, expected, strict=True):
        assert want in problem


def test_each_ranks_distributed_seconds_is_a_metric() -> None:
    from warmgate.server.core.results import (
        PhaseResult,
        PhaseStatus,
        WarmupOutcome,
        WarmupReport,
    )
    from warmgate.server.telemetry.metrics import Metrics

    metrics = Metrics()
    phase = PhaseResult(name="distributed", status=PhaseStatus.RAN, duration_s=0.5,
                        shapes={"rank_seconds": [0.25, 0.5]})
    metrics.observe_report(WarmupReport(WarmupOutcome.SUCCEEDED, [phase], 0.5, "hash"))
    registry = metrics.registry
    assert [registry.get_sample_value("warmgate_distributed_rank_seconds", {"rank": r})
            for r in ("0", "1")] == [0.25, 0.5]
    assert registry.get_sample_value("warmgate_phase_duration_seconds_sum",
                                     {"phase": "distributed"}) == 0.5
