""".ci/check_rollout.py, which .ci/deploy-checks runs on every rendered kustomization: a
missing Namespace, a slow startup probe, a cache lock timeout past the startup budget, a
pre-warm Job on another GPU product and a missing PodDisruptionBudget are each reported; the
repository's own builds (rendered here when kubectl is installed) pass."""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".ci"))
from check_manifests import check  # noqa: E402
from check_rollout import check_rollout  # noqa: E402

LABELS = {"app.kubernetes.io/name": "warmgate", "app.kubernetes.io/component": "server"}


def workload(kind: str, *, period: int = 2, threshold: int = 300, product: str | None = None,
             gpu: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "warmgate", "envFrom": [{"configMapRef": {"name": "cfg"}}],
        "startupProbe": {"grpc": {"port": 50051}, "periodSeconds": period,
                         "failureThreshold": threshold}}
    if gpu:
        container["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    spec: dict[str, Any] = {"containers": [container]}
    if product:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": product}
    return {"kind": kind, "metadata": {"name": "warmgate", "namespace": "ns"},
            "spec": {"template": {"metadata": {"labels": dict(LABELS)}, "spec": spec}}}


def build(**env: str) -> list[dict[str, Any]]:
    return [
        {"kind": "Namespace", "metadata": {"name": "ns"}},
        {"kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": "ns"},
         "data": {"WARMGATE_CACHE_DIR": "/var/cache/warmgate", **env}},
        {"kind": "PodDisruptionBudget", "metadata": {"name": "warmgate", "namespace": "ns"},
         "spec": {"maxUnavailable": 1, "selector": {"matchLabels": dict(LABELS)}}},
        workload("Deployment", gpu=True, product="NVIDIA-H200"),
    ]


def test_a_sound_build_passes() -> None:
    assert check_rollout(build()) == []


def test_an_uncreated_namespace_is_reported() -> None:
    objs = build()[1:]
    assert any("namespace ns is not created" in p for p in check_rollout(objs))


def test_a_slow_startup_probe_is_reported() -> None:
    objs = build()
    objs[3] = workload("Deployment", period=10, threshold=60, gpu=True, product="NVIDIA-H200")
    assert any("polls every 10 s" in p for p in check_rollout(objs))


def test_a_cache_lock_timeout_past_the_startup_budget_is_reported() -> None:
    objs = build()
    objs[3] = workload("Deployment", threshold=60, gpu=True, product="NVIDIA-H200")  # 120 s
    assert any("--cache-lock-timeout 240 s >= startup budget 120 s" in p
               for p in check_rollout(objs))
    objs[1]["data"]["WARMGATE_CACHE_LOCK_TIMEOUT"] = "60"
    assert check_rollout(objs) == []


def test_the_prewarm_job_must_select_the_deployments_gpu() -> None:
    job = workload("Job", gpu=True, product="NVIDIA-A100")
    assert any("different GPU products" in p for p in check_rollout([*build(), job]))
    unpinned = workload("Job", gpu=True)
    assert any("Job/warmgate: requests a GPU but selects no single" in p
               for p in check_rollout([*build(), unpinned]))
    assert check_rollout([*build(), workload("Job", gpu=True, product="NVIDIA-H200")]) == []


def test_a_missing_pod_disruption_budget_is_reported() -> None:
    objs = [o for o in build() if o["kind"] != "PodDisruptionBudget"]
    assert "no PodDisruptionBudget selects the Deployment's pods" in check_rollout(objs)
    other = copy.deepcopy(build())
    other[2]["spec"]["selector"]["matchLabels"] = {"app": "else"}
    assert "no PodDisruptionBudget selects the Deployment's pods" in check_rollout(other)


KUSTOMIZATIONS = sorted(p.parent for p in (ROOT / "deploy").rglob("kustomization.yaml")
                        if "kind: Component" not in p.read_text(encoding="utf-8"))


@pytest.mark.skipif(shutil.which("kubectl") is None,
                    reason="kubectl renders the builds (.ci/deploy-checks installs it)")
@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_repositorys_builds_pass(directory: Path) -> None:
    rendered = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True,
                              text=True, check=True, timeout=120).stdout
    objs = [o for o in yaml.safe_load_all(rendered) if o]
    problems, _notes = check(objs)
    assert problems == []


def _probed(port: int, **env: str) -> list[str]:
    objs = [{"apiVersion": "v1", **o} for o in build(**env)]  # check() reads apiVersion
    container = objs[-1]["spec"]["template"]["spec"]["containers"][0]
    container["ports"] = [{"name": "grpc", "containerPort": 50051},
                          {"name": "health", "containerPort": 50052}]
    container["startupProbe"]["grpc"]["port"] = port
    return [p for p in check(objs)[0] if "startupProbe asks port" in p]


def test_probes_must_ask_the_port_that_serves_them() -> None:
    assert _probed(50052, WARMGATE_HEALTH_PORT="50052") == []
    assert _probed(50051) == []  # no health process: the main port answers
    # The health process is configured but the probes still ask the model server's port.
    assert "WARMGATE_HEALTH_PORT=50052" in _probed(50051, WARMGATE_HEALTH_PORT="50052")[0]
    # Nothing serves health on 50052 without WARMGATE_HEALTH_PORT.
    assert "no WARMGATE_HEALTH_PORT" in _probed(50052)[0]
