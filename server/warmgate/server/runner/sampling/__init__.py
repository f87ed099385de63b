"""The runner's sampler: rows -> logits processors -> greedy choice or warpers and the race,
and log probabilities from the raw logits."""

from warmgate.server.runner.sampling.logprobs import MAX_LOGPROBS, gather_logprobs
from warmgate.server.runner.sampling.rows import SamplingRows, TokenHistory
from warmgate.server.runner.sampling.sampler import Sampler
from warmgate.server.runner.sampling.seeded import SeededStream, make_generator
from warmgate.server.runner.scheduler_output import TokenLogprobs

__all__ = ["MAX_LOGPROBS", "Sampler", "SamplingRows", "SeededStream", "TokenHistory",
           "TokenLogprobs", "gather_logprobs", "make_generator"]
