"""Settings of the serving path (they shape no compiled code, so they are not in the runner's
config hash or the compile cache key)."""

from __future__ import annotations

from dataclasses import dataclass

from warmgate.server.config.runner_config import ConfigError


@dataclass(frozen=True)
class ServingConfig:
    # Answer Generate before the warmup plan succeeded (its first requests then pay for the
    # compiles warmup would have done); off, Generate is UNAVAILABLE until ready.
    serve_before_ready: bool = False
    # The n-gram drafter's suffix sizes, tried longest first (used with
    # num_speculative_steps > 0).
    ngram_min: int = 1
    ngram_max: int = 4
    # Requests admitted but not yet running, at most; more are RESOURCE_EXHAUSTED.
    max_waiting_requests: int = 1024

    def __post_init__(self) -> None:
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigError("serving.ngram_min", f"need 1 <= --ngram-min <= --ngram-max, got "
                              f"{self.ngram_min} and {self.ngram_max}")
        if self.max_waiting_requests < 1:
            raise ConfigError("serving.max_waiting_requests",
                              f"must be >= 1, got {self.max_waiting_requests}")
