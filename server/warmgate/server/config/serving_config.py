"""Settings of the serving path (they shape no compiled code, so they are not in the runner's
config hash or the compile cache key)."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmgate.server.config.flags import flag
from warmgate.server.config.runner_config import ConfigError


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
    max_waiting_requests: int = field(default=1024, metadata=flag(
        "--max-waiting-requests", "Generate requests queued for a batch slot, at most; more "
        "are answered RESOURCE_EXHAUSTED"))

    def __post_init__(self) -> None:
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigError("serving.ngram_min", f"need 1 <= --ngram-min <= --ngram-max, got "
                              f"{self.ngram_min} and {self.ngram_max}")
        if self.max_waiting_requests < 1:
            raise ConfigError("serving.max_waiting_requests",
                              f"must be >= 1, got {self.max_waiting_requests}")
