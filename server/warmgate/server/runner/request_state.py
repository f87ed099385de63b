"""What the runner keeps per request between steps, and one request's slice of a step."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmgate.server.runner.scheduler_output import SamplingParams

# An output token sampled on the device and not read back yet (runner/async_output.py). Never
# a token id: one reaching the embedding or a penalty's scatter fails loudly.
PLACEHOLDER = -1


@dataclass
class RequestState:
    req_id: str
    prompt_token_ids: list[int]
    # None for a pooling model's requests.
    sampling_params: SamplingParams | None
    # KV cache group 0's blocks, in position order; never holds the null block.
    block_ids: list[int]
    # Tokens in the KV cache, as the scheduler last said (or as this runner advanced it).
    num_computed_tokens: int
    # Tokens this runner sampled (accepted drafts included), appended in order.
    output_token_ids: list[int] = field(default_factory=list)
    # Its row of the last step's tokens left on the device (runner/async_output.py), read
    # while its newest output is still PLACEHOLDER.
    device_row: int = -1

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Length of the token stream the runner holds: prompt, then outputs."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def input_token_ids(self, start: int, count: int) -> list[int]:
        """`count` tokens of the stream from position `start` (one: input_token's rule)."""
        if count == 1:
            return [self.input_token(start)]
        n_prompt = len(self.prompt_token_ids)
        if start + count <= n_prompt:
            return self.prompt_token_ids[start:start + count]
        if start >= n_prompt and start + count <= self.num_tokens:  # outputs only
            return self.output_token_ids[start - n_prompt:start - n_prompt + count]
        if start + count <= self.num_tokens:
            stream = self.prompt_token_ids + self.output_token_ids
            return stream[start:start + count]
        raise ValueError(f"request {self.req_id!r}: tokens {start}..{start + count - 1} were "
                         f"scheduled but the runner holds only {self.num_tokens}")

    def input_token(self, position: int) -> int:
        """The stream's token at `position`: a decode's one input, read without a list.

        A single decode token scheduled past the end of the stream happens when the scheduler
        claims positions the runner never produced (warmup advances num_computed_tokens by
        the full decode length without reading outputs, as vLLM's does): feed the latest
        token held, which keeps shapes and positions exactly as scheduled.
        """
        past_prompt = position - len(self.prompt_token_ids)
        if past_prompt < 0:
            return self.prompt_token_ids[position]
        if past_prompt < len(self.output_token_ids):
            return self.output_token_ids[past_prompt]
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]


# Not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__, and a
# step makes one per scheduled request. Nobody changes one.
@dataclass(slots=True)
class ScheduledRequest:
    """One request's part of the current step."""

    state: RequestState
    # Tokens already in the KV cache; this step's query starts at this position.
    num_computed_tokens: int
    # Tokens this step, drafts included.
    num_scheduled_tokens: int
    draft_token_ids: tuple[int, ...] = ()
    # Read several times a step by the input preparation, the sampler and the bitmask, all
    # before the step's tokens are appended to state: fixed once here.
    num_logits_rows: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        # Whether this step reaches the end of the token stream the runner holds (the
        # prompt, or prompt + outputs for a request resumed after preemption): mid-prefill
        # chunks sample nothing. Worked out once here: one is made per request every step.
        num_drafts = len(self.draft_token_ids)
        ends = (self.num_computed_tokens + self.num_scheduled_tokens - num_drafts
                >= self.state.num_tokens)
        self.num_logits_rows = 1 + num_drafts if ends else 0

    @property
    def req_id(self) -> str:
        return self.state.req_id

    @property
    def num_draft_tokens(self) -> int:
        return len(self.draft_token_ids)

    @property
    def seq_len(self) -> int:
        return self.num_computed_tokens + self.num_scheduled_tokens

    @property
    def needs_logits(self) -> bool:
        """Whether this step reaches the end of the request's token stream (see
        __post_init__): it has logits rows."""
        return self.num_logits_rows > 0
