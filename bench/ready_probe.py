"""One `warmgate-server` process timed from its start to health SERVING, with its log timeline.

Each stderr line is stamped with its arrival time (seconds since the process started), so the
start-up breakdown (imports, CUDA init, weights, KV cache, each warmup phase) is read from the
server's own one-line-per-decision log, not from a second clock inside it.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

HEALTH_PORT = re.compile(r"serving grpc\.health\.v1 \(plaintext\) on [^:]+:(\d+)")
PHASE = re.compile(r"phase=(\S+) status=(\S+) seconds=([\d.]+) reason=\S+ shapes=(\{.*?\}) "
                   r"num_reqs=")
WARMUP = re.compile(r"warmup outcome=(\S+) seconds=([\d.]+)")
WEIGHTS = re.compile(r"weights read: .* ([\d.]+) GB in ([\d.]+) s \(([\d.]+) GB/s\)")
CUDA_INIT = re.compile(r"start-up: CUDA context on \S+ in ([\d.]+) s")
JIT_COMPILED = re.compile(r"jit event: (\S+) (.+?) compiled in ([\d.]+) s")
FIRST_CONFIG_LINE = re.compile(r"config_hash=")
POLL_S = 0.02
SERVING = health_pb2.HealthCheckResponse.SERVING


@dataclass
class ReadyRun:
    """What one server start showed: ready time, the log timeline and the figures in it."""

    ready_s: float
    lines: list[tuple[float, str]] = field(default_factory=list)

    def first(self, pattern: re.Pattern[str]) -> tuple[float, re.Match[str]] | None:
        for at, line in self.lines:
            if (m := pattern.search(line)) is not None:
                return at, m
        return None

    def phases(self) -> dict[str, tuple[float, dict[str, Any]]]:
        """{phase: (seconds, shapes)} of the first report the log holds."""
        out: dict[str, tuple[float, dict[str, Any]]] = {}
        for _, line in self.lines:
            if (m := PHASE.search(line)) is not None and m.group(1) not in out:
                out[m.group(1)] = (float(m.group(3)), json.loads(m.group(4)))
        return out

    def breakdown(self) -> dict[str, float | None]:
        """Seconds per start-up step; None where the log did not say (e.g. no CUDA)."""
        config = self.first(FIRST_CONFIG_LINE)
        cuda = self.first(CUDA_INIT)
        weights = self.first(WEIGHTS)
        health = self.first(HEALTH_PORT)
        warmup = self.first(WARMUP)
        phases = self.phases()
        load_shapes = phases.get("load", (0.0, {}))[1]
        out: dict[str, float | None] = {
            "imports_and_config_s": config[0] if config else None,
            "health_bound_at_s": health[0] if health else None,
            "cuda_init_s": float(cuda[1].group(1)) if cuda else None,
            "weights_s": float(weights[1].group(2)) if weights else load_shapes.get(
                "weights_s"),
            "weights_gb_per_s": float(weights[1].group(3)) if weights else None,
            "kv_cache_s": load_shapes.get("kv_cache_s"),
            "warmup_total_s": float(warmup[1].group(2)) if warmup else None,
            "ready_s": self.ready_s,
        }
        for name, (seconds, _) in phases.items():
            out[f"phase.{name}_s"] = seconds
        return out

    def longest_compile_s(self) -> float | None:
        """The longest single compile: from the JIT events (logged at DEBUG, one per Triton
        kernel or FlashInfer module); without any, FlashInfer's longer wrapper warmup."""
        seconds = [float(m.group(3)) for _, line in self.lines
                   if (m := JIT_COMPILED.search(line)) is not None]
        seconds = [s for s in seconds if s > 0]
        if seconds:
            return max(seconds)
        fi = self.phases().get("flashinfer", (0.0, {}))[1].get("longest_module_s")
        return float(fi) if fi else None


def _healthy(port: int) -> bool:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0)
        except grpc.RpcError:
            return False
    return reply.status == SERVING


def run_to_ready(argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> ReadyRun:
    """Start the server (with exactly `env`), poll health until SERVING, stop it (SIGTERM);
    the ready time and log.

    Raises RuntimeError with the log's tail if it exits or does not get ready in time.
    """
    run = ReadyRun(ready_s=0.0)
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "warmgate.server.main", *argv],
                            env=dict(env), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)

    def read() -> None:
        assert proc.stderr is not None  # stderr=PIPE
        for line in proc.stderr:
            run.lines.append((time.monotonic() - start, line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        port = None
        while time.monotonic() - start < timeout_s:
            if proc.poll() is not None:
                break
            if port is None and (hit := run.first(HEALTH_PORT)) is not None:
                port = int(hit[1].group(1))
            if port is not None and _healthy(port):
                run.ready_s = time.monotonic() - start
                return run
            time.sleep(POLL_S)
        if proc.poll() is not None:
            reader.join(10)  # the last lines, the reason among them
        tail = "\n".join(line for _, line in run.lines[-30:])
        raise RuntimeError(f"server not SERVING (exit code {proc.poll()}) after "
                           f"{time.monotonic() - start:.1f} s:\n{tail}")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        reader.join(10)
