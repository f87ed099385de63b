"""What a scheduler hands the runner each step (vLLM's SchedulerOutput, trimmed to what we use).

Warmup builds these by hand and feeds them through `worker_execute_model`, exactly as vLLM's
MRV2 warmup does, so the runner cannot tell a warmup batch from a real one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TokenLogprobs:
    """One token's log probability under the model's raw logits, its rank (1 + the number of
    tokens strictly more likely) and the requested most likely tokens."""

    token_id: int
    logprob: float
    rank: int
    # The num_top most likely (token id, logprob), most likely first.
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class PromptLogprobs:
    """entries[j] is prompt token start + 1 + j given the tokens before it."""

    start: int
    entries: list[TokenLogprobs]


@dataclass(frozen=True)
class SamplingParams:
    # temperature 0 means greedy; top_k 0 and top_p 1.0 mean disabled.
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    # A seed makes this request's samples reproducible whatever else shares the batch.
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    # Logits processors (runner/sampling/processors.py); each default is the neutral value.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    # stop_token_ids are masked until this many tokens were generated.
    min_tokens: int = 0
    # (token id, bias) pairs, sorted by id.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # Top-n log probabilities per generated / prompt token; None returns none.
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)

    @cached_property
    def uses_logits_processors(self) -> bool:
        """Whether any logits processor may change this request's logits: a batch of
        requests without it skips the processors (and their row bookkeeping) entirely.
        Computed once per request (the sampler asks every step)."""
        return (bool(self.logit_bias) or self.has_penalties
                or (self.min_tokens > 0 and bool(self.stop_token_ids)))

    @property
    def is_seeded(self) -> bool:
        return self.seed is not None and not self.is_greedy


GREEDY = SamplingParams(temperature=0.0)


@dataclass
class NewRequestData:
    """A request scheduled for the first time."""

    req_id: str
    prompt_token_ids: list[int]
    # One list of block ids per KV cache group; ids index the paged KV cache (0 is the null block).
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int = 0
    # None for a pooling model.
    sampling_params: SamplingParams | None = None
    # Tokens generated before a preemption: a resumed request recomputes prompt + these and
    # carries on sampling (its seeded generator continues from len(output_token_ids)).
    output_token_ids: list[int] = field(default_factory=list)


@dataclass
class CachedRequestData:
    """Requests the runner already holds, scheduled again (decode, or a later prefill chunk)."""

    req_ids: list[str] = field(default_factory=list)
    # Blocks appended this step, per request, per KV cache group; None means no new blocks.
    new_block_ids: list[tuple[list[int], ...] | None] = field(default_factory=list)
    # Tokens the request had in its KV cache before this step.
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    # Tokens scheduled per request this step, draft tokens included.
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    # Draft tokens to verify this step, per request (speculative decoding).
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # Requests to drop before this step runs; their blocks go back to the scheduler.
    finished_req_ids: set[str] = field(default_factory=set)

    @property
    def num_reqs(self) -> int:
        return len(self.num_scheduled_tokens)


@dataclass
class GrammarOutput:
    """Structured-output bitmasks for one step, as vLLM passes them to sample_tokens: the
    constrained requests in schedule order and, for each, one bitmask row per logits row it
    samples (1 + its drafts), xgrammar's layout (int32, ceil(vocab / 32) words, bit set =
    allowed), on the host."""

    structured_output_request_ids: list[str] = field(default_factory=list)
    grammar_bitmask: torch.Tensor | None = None  # [sum of rows, ceil(V / 32)] int32


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    # Tokens appended per request this step: the accepted drafts plus one sampled token. Empty
    # for a request still in the middle of a chunked prefill, and for pooling models.
    sampled_token_ids: list[list[int]]
    # Draft tokens accepted per request (0 without speculation).
    num_accepted_draft_tokens: list[int] = field(default_factory=list)
    # Pooling models: one embedding per request that finished its prompt this step.
    pooler_output: list[object] | None = None
    # Per request, one entry per sampled token when it asked for logprobs (else []); None
    # when no request of the step asked.
    logprobs: list[list[TokenLogprobs]] | None = None
    # The prompt positions this step read, for requests that asked for prompt logprobs.
    prompt_logprobs: dict[str, PromptLogprobs] = field(default_factory=dict)
