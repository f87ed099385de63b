"""Prometheus series of the serving path, on the server's registry (see metrics.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from warmgate.server.runner.sampling_features import SAMPLING_FEATURES, sampling_features
from warmgate.server.runner.scheduler_output import SamplingParams
from warmgate.server.serving.loop import STEP_KINDS, Occupancy, StepStats
from warmgate.server.serving.overlap import SERIAL_REASONS
from warmgate.server.serving.request import FinishReason, Usage

FINISH_REASONS = (*(r.value for r in FinishReason), "cancelled", "error")
# The request features the counter labels: the sampler's, and a grammar (structured output).
REQUEST_FEATURES = (*SAMPLING_FEATURES, "structured")
# Time to first token: sub-millisecond on a warm GPU decode, seconds when a request queues
# behind a long prefill or pays a cold compile.
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
                120)
# A grammar compile: milliseconds for a small schema, up to the budget (10 s by default)
# for a large one; "timeout" samples sit at the budget.
GRAMMAR_COMPILE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)
# warmgate.server.serving.grammar.compiles.COMPILE_OUTCOMES (importing it would load xgrammar).
GRAMMAR_COMPILE_OUTCOMES = ("compiled", "invalid", "timeout", "cancelled")
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)


class ServingMetrics:
    def __init__(self, registry: CollectorRegistry, deterministic: bool = False) -> None:
        r = registry
        self.deterministic = deterministic
        self.deterministic_requests = Counter(
            "warmgate_deterministic_requests_total", "Generate requests ended while the server "
            "runs --deterministic (batch-invariant kernels; 0 without it).", registry=r)
        self.requests = Counter("warmgate_generate_requests_total",
                                "Generate requests ended, by finish reason.",
                                ["finish_reason"], registry=r)
        self.features = Counter("warmgate_generate_request_features_total",
                                "Generate requests admitted, by sampling feature used (a "
                                "request counts once per feature).", ["feature"], registry=r)
        for feature in REQUEST_FEATURES:
            self.features.labels(feature=feature)
        self.ttft = Histogram("warmgate_time_to_first_token_seconds",
                              "Arrival to first generated token, server side.",
                              buckets=TTFT_BUCKETS, registry=r)
        self.queue_time = Histogram("warmgate_request_queue_seconds",
                                    "Arrival to the first scheduled step.",
                                    buckets=TTFT_BUCKETS, registry=r)
        self.generated = Counter("warmgate_generated_tokens_total",
                                 "Tokens generated and returned.", registry=r)
        self.drafts = Counter("warmgate_spec_draft_tokens_total",
                              "Draft tokens verified.", registry=r)
        self.accepted = Counter("warmgate_spec_accepted_tokens_total",
                                "Draft tokens accepted.", registry=r)
        self.preemptions = Counter("warmgate_preemptions_total",
                                   "Requests preempted (KV blocks freed, recomputed later).",
                                   registry=r)
        # By kind, since a decoding stream's next token waits for every prompt chunk of its
        # step: the mixed steps' times are the inter-token latency's tail.
        self.step_duration = Histogram(
            "warmgate_step_duration_seconds", "One scheduler step: schedule, forward, sample; "
            "by kind: decode (no prompt tokens), mixed (prompt chunks beside decodes), prefill "
            "(prompt tokens only).", ["kind"], buckets=STEP_BUCKETS, registry=r)
        self.prompt_tokens = Counter(
            "warmgate_step_prompt_tokens_total", "Prompt tokens run through the model (a "
            "preempted request's recompute included), by the kind of step that ran them.",
            ["kind"], registry=r)
        for kind in STEP_KINDS:
            self.step_duration.labels(kind=kind)
            self.prompt_tokens.labels(kind=kind)
        self.grammar_compile = Histogram(
            "warmgate_grammar_compile_seconds", "Grammar compiles of Generate requests (one per "
            "distinct grammar: cached ones and ones shared by concurrent requests compile once), "
            "by outcome: compiled, invalid, timeout (past --grammar-compile-timeout), cancelled "
            "(every waiting request went first).", ["outcome"], buckets=GRAMMAR_COMPILE_BUCKETS,
            registry=r)
        for outcome in GRAMMAR_COMPILE_OUTCOMES:
            self.grammar_compile.labels(outcome=outcome)
        self.serial_steps = Counter(
            "warmgate_serial_steps_total", "Steps that did not overlap with the step before "
            "them under --async-scheduling, by reason: the next batch needed the last one's "
            "tokens on the host (grammar, spec_decode, penalties, preemption) or the step was "
            "sampled on the host (spec_decode, prompt logprobs, tensor_parallel).", ["reason"],
            registry=r)
        for reason in SERIAL_REASONS:
            self.serial_steps.labels(reason=reason)
        self.running = Gauge("warmgate_requests_running", "Requests holding KV blocks.",
                             registry=r)
        self.waiting = Gauge("warmgate_requests_waiting", "Requests queued for a slot.",
                             registry=r)
        self.kv_usage = Gauge("warmgate_kv_cache_usage_ratio",
                              "Fraction of the KV cache's usable blocks held by requests.",
                              registry=r)

    def observe_step(self, stats: StepStats) -> None:
        """Called on the worker thread; prometheus_client is thread-safe."""
        self.step_duration.labels(kind=stats.kind).observe(stats.seconds)
        if stats.num_prompt_tokens:
            self.prompt_tokens.labels(kind=stats.kind).inc(stats.num_prompt_tokens)
        if stats.serial_reason is not None:
            self.serial_steps.labels(reason=stats.serial_reason).inc()
        self.observe_occupancy(Occupancy(stats.num_running, stats.num_waiting,
                                         stats.num_blocks_used, stats.num_blocks_usable))

    def observe_occupancy(self, occupancy: Occupancy) -> None:
        """After every step and whenever blocks come free between steps."""
        self.running.set(occupancy.num_running)
        self.waiting.set(occupancy.num_waiting)
        self.kv_usage.set(occupancy.num_blocks_used / max(1, occupancy.num_blocks_usable))

    def observe_grammar_compile(self, outcome: str, seconds: float) -> None:
        self.grammar_compile.labels(outcome=outcome).observe(seconds)

    def observe_features(self, params: SamplingParams, *, structured: bool = False) -> None:
        for feature in sampling_features(params):
            self.features.labels(feature=feature).inc()
        if structured:
            self.features.labels(feature="structured").inc()

    def observe_finish(self, reason: str, usage: Usage, completion_tokens: int,
                       arrival_s: float) -> None:
        self.requests.labels(finish_reason=reason if reason in FINISH_REASONS
                             else "error").inc()
        if self.deterministic:
            self.deterministic_requests.inc()
        self.generated.inc(completion_tokens)
        self.drafts.inc(usage.num_draft_tokens)
        self.accepted.inc(usage.num_accepted_draft_tokens)
        self.preemptions.inc(usage.num_preemptions)
        if usage.first_token_s is not None:
            self.ttft.observe(usage.first_token_s - arrival_s)
        if usage.first_scheduled_s is not None:
            self.queue_time.observe(usage.first_scheduled_s - arrival_s)
