"""Cross-reference checks on a rendered kustomize overlay that schema validation cannot make.

kubernetes-validate checks each object against the API's schema on its own; this checks that
the objects fit together and fit the server:
  - every kind is either one the bundled schemas know or an explicitly skipped CRD;
  - probes, Service targetPorts, PodMonitor endpoints and NetworkPolicy ports name ports the
    container declares (numeric where the API needs a number, by name in the PodMonitor);
  - selectors select the pods; ConfigMaps and PVCs that pods reference exist;
  - the probes ask health service names the server registers: startup and readiness one
    gated on warmup, liveness the one that stays SERVING; and they ask the port that serves
    them: WARMGATE_HEALTH_PORT's (the health process) when the ConfigMap sets one, else the
    main port;
  - the ConfigMap's WARMGATE_* keys are flags warmgate-server knows, with values it accepts
    (parsed by the server's own load_server_config, without resolving the device);
  - service links are off (a Service named "warmgate" would inject WARMGATE_PORT=tcp://...);
  - a pod that asks for CUDA requests a GPU, and one that does not, doesn't; a tensor-parallel
    one requests one GPU per rank and mounts a memory-backed /dev/shm;
  - and check_rollout.py's: namespaces created, startup probe timing against
    --cache-lock-timeout, one GPU product for the Deployment and the pre-warm Job, a PDB.
Usage: python .ci/check_manifests.py NAME RENDERED.yaml [BUILTIN.yaml]
  exits 1 with a list of problems; BUILTIN.yaml gets the objects of built-in kinds only, for
  kubernetes-validate (which would only warn about a CRD it has no schema for).
"""

from __future__ import annotations

import contextlib
import io
import sys
from typing import Any

import yaml
from check_rollout import check_rollout

from warmgate.server.api.health import LIVENESS_SERVICE, READINESS_SERVICES
from warmgate.server.config.flags import ENV_PREFIX
from warmgate.server.config.server_config import build_parser
from warmgate.server.startup import load_server_config

# CRDs that kubernetes-validate has no schema for; checked here by reference instead.
SKIPPED_CRDS = {("monitoring.coreos.com/v1", "PodMonitor"),
                ("monitoring.coreos.com/v1", "PrometheusRule")}
BUILTIN_GROUPS = {"v1", "apps/v1", "batch/v1", "networking.k8s.io/v1", "policy/v1",
                  "autoscaling/v2", "rbac.authorization.k8s.io/v1"}
GPU = "nvidia.com/gpu"


def pod_specs(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(kind/name, pod template metadata, pod spec) of every workload."""
    out = []
    for o in objs:
        if o["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            t = o["spec"]["template"]
            out.append((f"{o['kind']}/{o['metadata']['name']}", t["metadata"], t["spec"]))
    return out


def selects(match: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match.items())


def check_config(name: str, data: dict[str, str], problems: list[str]) -> None:
    env = {k: v for k, v in data.items() if k.startswith(ENV_PREFIX)}
    # The server ignores a WARMGATE_* key that no flag reads, so a typo would pass silently.
    known = {a.dest.upper() for a in build_parser({})._actions}
    unknown = sorted(k for k in env if k.removeprefix(ENV_PREFIX) not in known)
    if unknown:
        problems.append(f"ConfigMap/{name}: keys no flag reads: {', '.join(unknown)}")
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            load_server_config([], environ=env, resolve=False)
    except SystemExit:
        lines = stderr.getvalue().strip().splitlines() or ["(no message)"]
        problems.append(f"ConfigMap/{name}: warmgate-server rejects it: {lines[-1]}")


def probe_port_of(env: dict[str, str]) -> tuple[int | None, int]:
    """(WARMGATE_HEALTH_PORT if set and on, the port the probes must ask): the health
    process's port, else the main port (WARMGATE_PORT, default 50051)."""
    health = int(env.get("WARMGATE_HEALTH_PORT", "-1"))
    if health > 0:
        return health, health
    return None, int(env.get("WARMGATE_PORT", "50051"))


def check_tensor_parallel(where: str, config: dict[str, str], limits: dict[str, Any],
                          spec: dict[str, Any], problems: list[str]) -> None:
    """A pod serving tensor-parallel on CUDA gets one GPU per rank, and NCCL a memory-backed
    /dev/shm (a container's default 64 MiB is too small for its shared-memory transport)."""
    size = int(config.get("WARMGATE_TENSOR_PARALLEL_SIZE", "1"))
    if size == 1 or not config.get("WARMGATE_DEVICE", "auto").startswith("cuda"):
        return
    if int(limits.get(GPU, 0)) != size:
        problems.append(f"{where}: WARMGATE_TENSOR_PARALLEL_SIZE={size} but {GPU} limit "
                        f"{limits.get(GPU, 0)}: one GPU per rank")
    memory_volumes = {v["name"] for v in spec.get("volumes", [])
                      if (v.get("emptyDir") or {}).get("medium") == "Memory"}
    mounts = {m["mountPath"]: m["name"] for c in spec["containers"]
              for m in c.get("volumeMounts", [])}
    if mounts.get("/dev/shm") not in memory_volumes:
        problems.append(f"{where}: WARMGATE_TENSOR_PARALLEL_SIZE={size} needs /dev/shm on an "
                        "emptyDir with medium Memory (NCCL's shared-memory transport)")


def check(objs: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    problems: list[str] = []
    notes: list[str] = []
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for o in objs:
        by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o
        key = (o["apiVersion"], o["kind"])
        if key in SKIPPED_CRDS:
            notes.append(f"{o['kind']}/{o['metadata']['name']}: CRD, no bundled schema; "
                         "schema skipped, references checked")
        elif o["apiVersion"] not in BUILTIN_GROUPS:
            problems.append(f"{o['kind']}/{o['metadata']['name']}: {o['apiVersion']} is neither "
                            "a built-in API nor a CRD this check knows to skip")

    for cm_name, cm in by_kind.get("ConfigMap", {}).items():
        if any(k.startswith(ENV_PREFIX) for k in cm.get("data", {})):
            check_config(cm_name, cm["data"], problems)

    pods = pod_specs(objs)
    ports_by_pod: dict[str, dict[str, int]] = {}
    for where, _meta, spec in pods:
        if by_kind.get("Service") and spec.get("enableServiceLinks", True):
            problems.append(f"{where}: enableServiceLinks must be false (Service links inject "
                            "WARMGATE_PORT=tcp://..., which the server reads as --port)")
        for c in spec["containers"]:
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            ports_by_pod[where] = ports
            env = {k: v for src in c.get("envFrom", [])
                   for k, v in by_kind.get("ConfigMap", {}).get(
                       src.get("configMapRef", {}).get("name"), {}).get("data", {}).items()}
            health_port, probe_port = probe_port_of(env)
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                grpc = c.get(probe, {}).get("grpc")
                if grpc is None:
                    continue
                if grpc["port"] not in ports.values():
                    problems.append(f"{where}: {probe} port {grpc['port']} is not a container "
                                    "port")
                if grpc["port"] != probe_port:
                    problems.append(
                        f"{where}: {probe} asks port {grpc['port']}; health for probes is on "
                        f"{probe_port} (" + (f"WARMGATE_HEALTH_PORT={health_port}: the health "
                                             "process" if health_port else
                                             "the main port; no WARMGATE_HEALTH_PORT") + ")")
                service = grpc.get("service", "")
                want = (LIVENESS_SERVICE,) if probe == "livenessProbe" else READINESS_SERVICES
                if service not in want:
                    problems.append(f"{where}: {probe} asks health service {service!r}; the "
                                    f"server answers {' or '.join(map(repr, want))} for it")
            start = c.get("startupProbe")
            if start:
                notes.append(f"{where}: startup budget {start.get('failureThreshold', 3)} x "
                             f"{start.get('periodSeconds', 10)} s = "
                             f"{start.get('failureThreshold', 3) * start.get('periodSeconds', 10)}"
                             " s")
            for src in c.get("envFrom", []):
                ref = src.get("configMapRef", {}).get("name")
                if ref and ref not in by_kind.get("ConfigMap", {}):
                    problems.append(f"{where}: envFrom ConfigMap {ref} is not in the build")
                device = by_kind.get("ConfigMap", {}).get(ref, {}).get("data", {}).get(
                    "WARMGATE_DEVICE", "auto")
                limits = c.get("resources", {}).get("limits", {})
                if device.startswith("cuda") and GPU not in limits:
                    problems.append(f"{where}: WARMGATE_DEVICE={device} but no {GPU} limit")
                if device == "cpu" and GPU in limits:
                    problems.append(f"{where}: a CPU pod requests a GPU")
                config = by_kind.get("ConfigMap", {}).get(ref, {}).get("data", {})
                check_tensor_parallel(where, config, limits, spec, problems)
        for v in spec.get("volumes", []):
            claim = v.get("persistentVolumeClaim", {}).get("claimName")
            if claim and claim not in by_kind.get("PersistentVolumeClaim", {}):
                problems.append(f"{where}: PVC {claim} is not in the build")

    def pods_selected(match: dict[str, str]) -> list[str]:
        return [where for where, meta, _ in pods if selects(match, meta.get("labels", {}))]

    for name, svc in by_kind.get("Service", {}).items():
        chosen = pods_selected(svc["spec"]["selector"])
        if not chosen:
            problems.append(f"Service/{name}: selects no pod")
        for p in svc["spec"]["ports"]:
            if not isinstance(p["targetPort"], int):
                problems.append(f"Service/{name}: targetPort {p['targetPort']!r} is not numeric")
            for where in chosen:
                if p["targetPort"] not in ports_by_pod[where].values():
                    problems.append(f"Service/{name}: {where} has no port {p['targetPort']}")
    for name, pm in by_kind.get("PodMonitor", {}).items():
        chosen = pods_selected(pm["spec"]["selector"]["matchLabels"])
        if not chosen:
            problems.append(f"PodMonitor/{name}: selects no pod")
        for ep in pm["spec"]["podMetricsEndpoints"]:
            for where in chosen:
                if ep["port"] not in ports_by_pod[where]:
                    problems.append(f"PodMonitor/{name}: {where} has no port named {ep['port']}")
    for name, np in by_kind.get("NetworkPolicy", {}).items():
        chosen = pods_selected(np["spec"]["podSelector"].get("matchLabels", {}))
        allowed = {p["port"] for rule in np["spec"].get("ingress", [])
                   for p in rule.get("ports", [])}
        for where in chosen:
            # The health port is the kubelet's, which NetworkPolicy does not filter.
            missing = {port for name, port in ports_by_pod[where].items()
                       if name != "health"} - allowed
            if missing:
                problems.append(f"NetworkPolicy/{name}: {where} ports {sorted(missing)} get no "
                                "ingress")
    return problems + check_rollout(objs), notes


def main(argv: list[str]) -> int:
    label, path, *builtin_path = argv
    with open(path, encoding="utf-8") as f:
        objs = [o for o in yaml.safe_load_all(f) if o]
    problems, notes = check(objs)
    if builtin_path:
        builtin = [o for o in objs if (o["apiVersion"], o["kind"]) not in SKIPPED_CRDS]
        with open(builtin_path[0], "w", encoding="utf-8") as f:
            yaml.safe_dump_all(builtin, f, sort_keys=False)
    for n in notes:
        print(f"  {label}: {n}")
    for p in problems:
        print(f"  {label}: PROBLEM {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
