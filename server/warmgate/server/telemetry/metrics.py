"""Prometheus metrics on their own registry (served over HTTP by telemetry.metrics_endpoint).

A registry per server (not prometheus_client's global one) lets tests run several servers in
one process. Every label value comes from a fixed set; anything else is folded into "other" so
a surprising phase name or RPC path cannot grow the series count.

The JIT series carry a `rank` label: the tensor-parallel rank the compile, graph miss or
communicator set-up happened on ("0" at TP=1; a worker's events reach rank 0 through
warmgate.server.distributed.replies).

`warmgate_warmup_state{state}` is one gauge per state, 1 for the current state and 0 for the
others (the usual enum pattern: `warmgate_warmup_state == 1` selects the current state and
`sum by (state)` counts pods per state).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from warmgate.server.core.phases import DISTRIBUTED, LOAD, SERVING_REHEARSAL, TP_PLAN_PHASES
from warmgate.server.core.results import PhaseStatus, SkipReason, WarmupReport
from warmgate.server.jit.events import (
    CACHED_KINDS,
    COMMUNICATOR_SETUP,
    CUDA_GRAPH_MISS,
    JitEvent,
)
from warmgate.server.telemetry.serving_metrics import FINISH_REASONS, ServingMetrics

OTHER = "other"
STATES = ("pending", "running", "ready", "failed")
SKIP_REASONS = tuple(r.value.lower() for r in SkipReason)
RPC_METHODS = (
    "/warmgate.v1.Warmup/WarmupKernels",
    "/warmgate.v1.Warmup/MixedWarmup",
    "/warmgate.v1.Warmup/GetStatus",
    "/warmgate.v1.Warmup/WatchStatus",
    "/warmgate.v1.Generation/Generate",
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
)
COMPILE_KINDS = ("triton", "flashinfer", "inductor", "dynamo", "autotune", OTHER)
# "entry": the --cache-dir entry as a whole (hit: READY found; miss or rebuilt: filled now).
CACHES = ("triton", "flashinfer", "inductor", "entry", OTHER)
# A first-use JIT takes tens of seconds per phase and a cold plan for a large model many
# minutes, so the buckets run to 30 minutes rather than prometheus_client's default 10 s.
PHASE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800)
# Health checks must answer in well under the kubelet's 1 s timeout; resolve the low end.
RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 300,
               1800)


# A report's phases: every phase of either plan, and the serving rehearsal's when it failed.
REPORT_PHASES = frozenset((*TP_PLAN_PHASES, SERVING_REHEARSAL))


def _label(value: str, allowed: Iterable[str]) -> str:
    return value if value in allowed else OTHER


class Metrics:
    def __init__(self, tensor_parallel_size: int = 1, deterministic: bool = False) -> None:
        self._ranks = tuple(str(r) for r in range(max(1, tensor_parallel_size)))
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.phase_duration = Histogram(
            "warmgate_phase_duration_seconds", "Wall time of a warmup phase that ran or failed.",
            ["phase"], buckets=PHASE_BUCKETS, registry=r)
        self.phase_skipped = Counter(
            "warmgate_phase_skipped_total", "Warmup phases skipped, by reason.",
            ["phase", "reason"], registry=r)
        self.warmup_state = Gauge(
            "warmgate_warmup_state", "1 for the current warmup state, 0 for the others.",
            ["state"], registry=r)
        self.ready = Gauge("warmgate_ready", "1 once the configured warmup succeeded.",
                           registry=r)
        # Tensor parallel only: the distributed phase's seconds on each rank (the phase's
        # duration is the slowest rank's).
        self.rank_warmup = Gauge(
            "warmgate_distributed_rank_seconds", "Seconds each tensor-parallel rank spent in "
            "the distributed warmup phase.", ["rank"], registry=r)
        # Incremented by observe_jit, a JitMonitor listener.
        self.jit_compiles = Counter(
            "warmgate_jit_compiles_total", "JIT compilations, by kind, whether health "
            "was already SERVING and tensor-parallel rank.", ["kind", "after_ready", "rank"],
            registry=r)
        # Uniform decodes that found no captured CUDA graph (another JitMonitor event).
        self.graph_misses = Counter(
            "warmgate_cuda_graph_misses_total", "Uniform-decode batches that found no captured "
            "CUDA graph and ran eagerly, by whether health was already SERVING and "
            "tensor-parallel rank.", ["after_ready", "rank"], registry=r)
        # Tensor parallel: first uses of a collective kind (op, dtype, process group).
        self.communicator_setups = Counter(
            "warmgate_communicator_setups_total", "Collective communicators set up (the "
            "first use of a collective kind on a rank), by whether health was already SERVING "
            "and tensor-parallel rank.", ["after_ready", "rank"], registry=r)
        self.cache_hits = Counter("warmgate_compile_cache_hits_total",
                                  "Compile cache hits, by cache.", ["cache"], registry=r)
        self.cache_misses = Counter("warmgate_compile_cache_misses_total",
                                    "Compile cache misses, by cache.", ["cache"], registry=r)
        self.cache_degraded = Gauge(
            "warmgate_compile_cache_degraded", "1 once a write into --cache-dir failed and "
            "this process compiles into a private temporary cache instead.", registry=r)
        self.rpc_requests = Counter("warmgate_rpc_requests_total", "RPCs handled, by status.",
                                    ["method", "code"], registry=r)
        self.rpc_duration = Histogram("warmgate_rpc_duration_seconds", "RPC handling time.",
                                      ["method"], buckets=RPC_BUCKETS, registry=r)
        # The Generate path's series, on the same registry.
        self.serving = ServingMetrics(r, deterministic)
        self.set_state("pending")
        self.ready.set(0)
        self._initialise_label_sets()
        self._load_observed = False
        self._cache_entry_observed = False

    def _initialise_label_sets(self) -> None:
        """Export 0 for every known label set of the counters the dashboard and alerts divide
        or take increase() of: a labelled series exists only once touched, so a pod whose
        lookups all missed would have no hits series and its hit ratio would be No data."""
        for cache in CACHES:
            self.cache_hits.labels(cache=cache)
            self.cache_misses.labels(cache=cache)
        for rank in self._ranks:
            for after_ready in ("true", "false"):
                for kind in COMPILE_KINDS:
                    self.jit_compiles.labels(kind=kind, after_ready=after_ready, rank=rank)
                self.graph_misses.labels(after_ready=after_ready, rank=rank)
                self.communicator_setups.labels(after_ready=after_ready, rank=rank)
        for reason in FINISH_REASONS:
            self.serving.requests.labels(finish_reason=reason)

    def set_state(self, state: str) -> None:
        for s in STATES:
            self.warmup_state.labels(state=s).set(1 if s == state else 0)

    def observe_report(self, report: WarmupReport) -> None:
        cache = report.compile_cache
        if cache and cache.get("state") in ("hit", "miss", "rebuilt") \
                and not self._cache_entry_observed:  # the entry is opened once per process
            self._cache_entry_observed = True
            (self.cache_hits if cache["state"] == "hit" else self.cache_misses).labels(
                cache="entry").inc()
        if cache:
            self.cache_degraded.set(1 if cache.get("degraded") else 0)
        for p in report.phases:
            phase = _label(p.name, REPORT_PHASES)
            if phase == LOAD and self._load_observed:
                continue  # the first plan's report repeats the load the controller observed
            self._load_observed = self._load_observed or phase == LOAD
            if phase == DISTRIBUTED:
                for rank, seconds in enumerate(p.shapes.get("rank_seconds", [])):
                    self.rank_warmup.labels(rank=str(rank)).set(seconds)
            if p.status is PhaseStatus.SKIPPED:
                reason = p.skip_reason.value.lower() if p.skip_reason else OTHER
                self.phase_skipped.labels(phase=phase, reason=_label(reason, SKIP_REASONS)).inc()
            else:
                self.phase_duration.labels(phase=phase).observe(p.duration_s)

    def observe_jit(self, event: JitEvent) -> None:
        """A JitMonitor listener: compiles by kind and readiness, compile-cache hits/misses.
        Runs on the compiling thread (or a worker rank's reply reader); prometheus_client
        counters are thread-safe."""
        after_ready, rank = str(event.after_ready).lower(), _label(str(event.rank), self._ranks)
        if event.kind == CUDA_GRAPH_MISS:
            self.graph_misses.labels(after_ready=after_ready, rank=rank).inc()
        if event.kind == COMMUNICATOR_SETUP:
            self.communicator_setups.labels(after_ready=after_ready, rank=rank).inc()
        if event.is_compile:
            self.jit_compiles.labels(kind=_label(event.kind, COMPILE_KINDS),
                                     after_ready=after_ready, rank=rank).inc()
        if event.kind in CACHED_KINDS:
            cache = _label(event.kind, CACHES)
            (self.cache_misses if event.compiled else self.cache_hits).labels(cache=cache).inc()

    def observe_rpc(self, method: str, code: str, seconds: float) -> None:
        method = _label(method, RPC_METHODS)
        self.rpc_requests.labels(method=method, code=code).inc()
        self.rpc_duration.labels(method=method).observe(seconds)

    def count_rpcs(self, method: str, code: str, count: int) -> None:
        """Calls another process handled (the health process): counted, not timed."""
        self.rpc_requests.labels(method=_label(method, RPC_METHODS), code=code).inc(count)
