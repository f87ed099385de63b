"""Checks on a rendered build about how it rolls out, beside check_manifests.py's references:
  - every namespace an object names is created by the build (a fresh cluster has none);
  - startupProbes poll every 2 s or faster (a pod warm in seconds waits at most that long);
  - --cache-lock-timeout (the ConfigMap's or the server's default) fits in the startup budget
    of every pod that uses a compile cache, so waiting on a pre-warm Job never outlasts it;
  - pods and Jobs that request a GPU select the same GPU product (the pre-warm Job fills the
    cache entry of the GPU the Deployment runs on);
  - a PodDisruptionBudget selects the server's pods.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

from warmgate.server.config.flags import ENV_PREFIX
from warmgate.server.startup import load_server_config

GPU = "nvidia.com/gpu"
GPU_PRODUCT = "nvidia.com/gpu.product"
MAX_STARTUP_PERIOD_S = 2


def _pods(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [(f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["metadata"],
             o["spec"]["template"]["spec"])
            for o in objs if o["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet")]


def _lock_timeout(env: dict[str, str]) -> float | None:
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            config = load_server_config([], environ=env, resolve=False)
        except SystemExit:
            return None  # check_manifests reports the ConfigMap itself
    return config.cache_lock_timeout_s if config.cache_dir else None


def _gpu_products(spec: dict[str, Any]) -> set[str]:
    products = set()
    if GPU_PRODUCT in spec.get("nodeSelector", {}):
        products.add(spec["nodeSelector"][GPU_PRODUCT])
    required = spec.get("affinity", {}).get("nodeAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", {})
    for term in required.get("nodeSelectorTerms", []):
        for expr in term.get("matchExpressions", []):
            if expr["key"] == GPU_PRODUCT and expr["operator"] == "In":
                products.add(",".join(sorted(expr["values"])))
    return products


def check_rollout(objs: list[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    namespaces = {o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"}
    for o in objs:
        ns = o["metadata"].get("namespace")
        if ns and ns not in namespaces:
            problems.append(f"{o['kind']}/{o['metadata']['name']}: namespace {ns} is not "
                            "created by the build (kubectl apply -k fails on a fresh cluster)")
    config_maps = {o["metadata"]["name"]: o.get("data", {}) for o in objs
                   if o["kind"] == "ConfigMap"}
    gpu_products: dict[str, set[str]] = {}
    for where, _meta, spec in _pods(objs):
        for c in spec["containers"]:
            env = {k: v for src in c.get("envFrom", [])
                   for k, v in config_maps.get(src.get("configMapRef", {}).get("name"), {})
                   .items() if k.startswith(ENV_PREFIX)}
            probe = c.get("startupProbe")
            if probe:
                period = probe.get("periodSeconds", 10)
                budget = period * probe.get("failureThreshold", 3)
                if period > MAX_STARTUP_PERIOD_S:
                    problems.append(f"{where}: startupProbe polls every {period} s; a pod warm "
                                    f"in seconds waits that long (use {MAX_STARTUP_PERIOD_S} s "
                                    "and raise failureThreshold)")
                lock = _lock_timeout(env)
                if lock is not None and lock >= budget:
                    problems.append(f"{where}: --cache-lock-timeout {lock:.0f} s >= startup "
                                    f"budget {budget} s: a pod waiting on another's cache fill "
                                    "is killed before it gives up waiting")
            if GPU in c.get("resources", {}).get("limits", {}):
                gpu_products[where] = _gpu_products(spec)
    for where, products in gpu_products.items():
        if len(products) != 1:
            problems.append(f"{where}: requests a GPU but selects no single "
                            f"{GPU_PRODUCT} (nodeSelector or required node affinity)")
    if len({frozenset(p) for p in gpu_products.values()}) > 1:
        problems.append("GPU workloads select different GPU products: "
                        + ", ".join(f"{w} {sorted(p)}" for w, p in gpu_products.items()))
    pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    servers = [meta.get("labels", {}) for where, meta, _ in _pods(objs)
               if where.startswith("Deployment/")]
    if servers and not any(
            all(labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items())
            for pdb in pdbs for labels in servers):
        problems.append("no PodDisruptionBudget selects the Deployment's pods")
    return problems
