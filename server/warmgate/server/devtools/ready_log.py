"""One `warmgate-server` start as its log timeline: each stderr line stamped with its arrival
time (seconds since the process started), and the start-up breakdown (imports, CUDA init,
weights, KV cache, each warmup phase) read from the server's own one-line-per-decision log,
not from a second clock inside it. Pure parsing (bench/lib/ready_probe.py runs the process)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

HEALTH_PORT = re.compile(r"serving grpc\.health\.v1 \(plaintext\) on [^:]+:(\d+)")
PHASE = re.compile(r"phase=(\S+) status=(\S+) seconds=([\d.]+) reason=\S+ shapes=(\{.*?\}) "
                   r"num_reqs=")
WARMUP = re.compile(r"warmup outcome=(\S+) seconds=([\d.]+)")
WEIGHTS = re.compile(r"weights read: .* ([\d.]+) GB in ([\d.]+) s \(([\d.]+) GB/s\)")
CUDA_INIT = re.compile(r"start-up: CUDA context on \S+ in ([\d.]+) s")
JIT_COMPILED = re.compile(r"jit event: (\S+) (.+?) compiled in ([\d.]+) s")
FIRST_CONFIG_LINE = re.compile(r"config_hash=")


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
