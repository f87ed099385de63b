"""Settings of the serving path (they shape no compiled code, so they are not in the runner's
config hash or the compile cache key)."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmgate.server.config import flag_values
from warmgate.server.config.flags import flag
from warmgate.server.config.runner_config import ConfigError

MIN_TEMPLATE_MEMORY_MIB = 64

# A grammar that takes longer is an outlier (the warmup's take milliseconds; a 12 KB schema
# of 150 patterned properties took 133 s on SmolLM2's vocabulary), and its request waits for
# it: past this, it fails.
GRAMMAR_COMPILE_TIMEOUT_S = 10.0
# Chat template renders waiting for a worker: past them a request is refused rather than
# queued, each waiting out up to --chat-template-timeout / --chat-template-workers.
CHAT_TEMPLATE_QUEUE = 16


@dataclass(frozen=True)
class ServingConfig:
    serve_before_ready: bool = field(default=False, metadata=flag(
        "--serve-before-ready", "answer Generate before the warmup plan succeeded (the first "
        "requests then pay for the compiles); off: UNAVAILABLE until ready"))
    # The n-gram drafter's suffix sizes, tried longest first (with num_speculative_steps > 0).
    ngram_min: int = field(default=1, metadata=flag(
        "--ngram-min", "smallest suffix n-gram the speculative drafter matches"))
    ngram_max: int = field(default=4, metadata=flag(
        "--ngram-max", "largest suffix n-gram the speculative drafter matches (tried first)"))
    # Fewer, fuller messages: at a hundred streams and more the front's cost is per message
    # written (gRPC's send), not per token.
    stream_interval: int = field(default=1, metadata=flag(
        "--stream-interval", "tokens a Generate stream gathers into one message after its "
        "first (which goes at once); 1 sends every step's tokens as they come, N waits for N "
        "tokens (or the end) so the front writes up to N times fewer messages",
        parse=flag_values.positive))
    max_waiting_requests: int = field(default=1024, metadata=flag(
        "--max-waiting-requests", "Generate requests queued for a batch slot, at most; more "
        "are answered RESOURCE_EXHAUSTED"))
    # The chat template runs in worker processes with these bounds (text.template_process).
    chat_template_timeout_s: float = field(default=1.0, metadata=flag(
        "--chat-template-timeout", "seconds a chat template may take to render one request's "
        "messages (or to compile at start-up); past it the request fails INVALID_ARGUMENT",
        parse=flag_values.positive_float))
    chat_template_memory_mib: int = field(default=256, metadata=flag(
        "--chat-template-memory", "MiB of address space for each chat template worker "
        "process; a render that needs more fails its request INVALID_ARGUMENT"))
    chat_template_workers: int = field(default=2, metadata=flag(
        "--chat-template-workers", "chat template renders running at once, each in its own "
        "worker process; more requests wait for one"))
    chat_template_queue: int = field(default=CHAT_TEMPLATE_QUEUE, metadata=flag(
        "--chat-template-queue", "chat template renders waiting for a worker, at most; more "
        "requests are answered RESOURCE_EXHAUSTED", parse=flag_values.non_negative))
    # Structured output (serving/grammar/compiles.py). The budget covers everything before the
    # first step: the wait for a compile slot and a probe, the compile in the killable probe,
    # and the build where the grammar is served.
    grammar_compile_timeout_s: float = field(default=GRAMMAR_COMPILE_TIMEOUT_S, metadata=flag(
        "--grammar-compile-timeout", "seconds a request's grammar (JSON schema, regex, EBNF) may "
        "take to be ready before its first step, waiting for a compile slot included; it "
        "compiles twice (a killable probe, then where it is served), so one that takes more "
        "than half of what is left fails early; past it the request fails RESOURCE_EXHAUSTED",
        parse=flag_values.positive_float))
    grammar_max_compiles: int = field(default=2, metadata=flag(
        "--grammar-max-compiles", "grammar compiles running at once: probes (each a process "
        "forked from one zygote of about 260 MiB), and as many builds where grammars are "
        "served; more grammar requests wait, within their budget"))
    grammar_cache_mib: int = field(default=512, metadata=flag(
        "--grammar-cache-mib", "resident memory compiled grammars may hold where they are "
        "served (the engine process when it is on), least recently used dropped first"))
    async_scheduling: bool = field(default=True, metadata=flag(
        "--async-scheduling", "overlap the host's work with the device: build and launch step "
        "N+1 while step N runs and only then wait for N's sampled tokens; a step that needs "
        "them first (grammar, drafts, penalties, a possible preemption) runs serially, counted "
        "in warmgate_serial_steps_total"))
    grammar_json_whitespace: bool = field(default=False, metadata=flag(
        "--grammar-json-whitespace", "let JSON-schema output put free whitespace (up to 20 "
        "characters: newlines, indentation) between elements; off: compact one-line JSON"))

    def __post_init__(self) -> None:
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigError("serving.ngram_min", f"need 1 <= --ngram-min <= --ngram-max, got "
                              f"{self.ngram_min} and {self.ngram_max}")
        # An interpreter with jinja2 takes about 25 MiB of address space before any render.
        if self.chat_template_memory_mib < MIN_TEMPLATE_MEMORY_MIB:
            raise ConfigError("serving.chat_template_memory_mib",
                              f"must be >= {MIN_TEMPLATE_MEMORY_MIB}, got "
                              f"{self.chat_template_memory_mib}")
        if self.chat_template_workers < 1:
            raise ConfigError("serving.chat_template_workers",
                              f"must be >= 1, got {self.chat_template_workers}")
        if not self.grammar_compile_timeout_s > 0:  # also false for NaN
            raise ConfigError("serving.grammar_compile_timeout_s",
                              f"must be > 0, got {self.grammar_compile_timeout_s}")
        if self.grammar_max_compiles < 1:
            raise ConfigError("serving.grammar_max_compiles",
                              f"must be >= 1, got {self.grammar_max_compiles}")
        if self.grammar_cache_mib < 0:
            raise ConfigError("serving.grammar_cache_mib",
                              f"must be >= 0, got {self.grammar_cache_mib}")
        if self.stream_interval < 1:
            raise ConfigError("serving.stream_interval",
                              f"must be >= 1, got {self.stream_interval}")
        if self.max_waiting_requests < 1:
            raise ConfigError("serving.max_waiting_requests",
                              f"must be >= 1, got {self.max_waiting_requests}")
