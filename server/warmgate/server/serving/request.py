"""One Generate request as the scheduler tracks it, and what a step reports about it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from warmgate.server.runner.scheduler_output import PromptLogprobs, SamplingParams, TokenLogprobs
from warmgate.server.serving.ngram import NgramIndex

if TYPE_CHECKING:  # xgrammar loads only where grammars are used
    from warmgate.server.serving.grammar.matcher import RequestGrammar


class FinishReason(enum.Enum):
    LENGTH = "length"  # max_tokens produced
    STOP = "stop"  # a stop token produced
    MAX_MODEL_LEN = "max_model_len"  # the sequence filled the context


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # not in the KV cache: new, or preempted
    RUNNING = "running"  # holds KV blocks; the runner holds its state
    FINISHED = "finished"


@dataclass
class Usage:
    num_steps: int = 0
    num_preemptions: int = 0
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    # perf_counter() stamps; None until they happen.
    first_scheduled_s: float | None = None
    first_token_s: float | None = None


@dataclass
class ServingRequest:
    req_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    # time.perf_counter() when the server received it.
    arrival_s: float
    drafter: NgramIndex | None = None
    # Structured output: the grammar its tokens must follow (its state is the outputs so far).
    grammar: RequestGrammar | None = None
    # Structured output served by an engine process: the engine holds the request's grammar
    # (built there under its req_id) and `grammar` stays None on this side.
    engine_grammar: bool = False
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    # Tokens whose KV is in this request's blocks (0 while waiting).
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    # How many of block_ids the runner has been told about.
    num_blocks_sent: int = 0
    # Whether the runner holds this request's state (scheduled since it last (re)started).
    in_runner: bool = False
    finish_reason: FinishReason | None = None
    usage: Usage = field(default_factory=Usage)
    # Prompt logprobs gathered over the prefill chunks (entry i: prompt token i + 1), sent
    # with the first tokens; a recompute after preemption reads positions already held.
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs_sent: bool = False
    # Tokens a launched step samples that the host has not read yet (overlapped scheduling,
    # serving/overlap.py): counted in the stream's length so the next step is scheduled
    # past them, not in output_token_ids until they arrive.
    num_pending_tokens: int = 0

    def __post_init__(self) -> None:
        if self.drafter is not None:
            self.drafter.extend(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens (pending ones too): the stream whose KV the request
        needs."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) + self.num_pending_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens of the stream not in the KV cache yet: the rest of the prompt (or, after a
        preemption, of prompt + outputs), or 1 when decoding (the last sampled token)."""
        return self.num_tokens - self.num_computed_tokens

    def add_prompt_logprobs(self, chunk: PromptLogprobs) -> None:
        """Keep the entries of positions not held yet (chunks arrive in position order)."""
        have = len(self.prompt_logprobs)
        if chunk.start <= have < chunk.start + len(chunk.entries):
            self.prompt_logprobs += chunk.entries[have - chunk.start:]

    def take_prompt_logprobs(self) -> list[TokenLogprobs]:
        """The prompt logprobs, once: for the first message that carries tokens."""
        if self.prompt_logprobs_sent or self.params.prompt_logprobs is None:
            return []
        self.prompt_logprobs_sent = True
        return self.prompt_logprobs

    @property
    def num_tokens_left(self) -> int:
        """Tokens it may still generate before max_tokens."""
        return self.params.max_tokens - len(self.output_token_ids)


# Not frozen: a frozen dataclass's __init__ goes through object.__setattr__ per field, 1.5 us
# an event against 0.5 here, and a step makes one per running request. Nobody changes one.
@dataclass(slots=True)
class StepEvent:
    """What one step produced for one request (sent to its stream)."""

    req_id: str
    token_ids: list[int]
    # time.perf_counter() when the step's tokens were on the host.
    time_s: float
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    finish_reason: FinishReason | None = None
    # The request's counters; set with finish_reason.
    usage: Usage | None = None
    # Set instead of tokens when the request failed (the stream ends with this error).
    error: BaseException | None = None
    # One per token when the request asked for logprobs.
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    # The whole prompt's, on the request's first event with tokens, when it asked.
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)


def merge_events(events: list[StepEvent]) -> StepEvent:
    """Several steps' events of one request as one (in order; none carries an error): the
    tokens a slow reader let pile up, sent in its next message."""
    if len(events) == 1:
        return events[0]
    last = events[-1]
    return StepEvent(
        last.req_id, [t for e in events for t in e.token_ids], last.time_s,
        sum(e.num_draft_tokens for e in events),
        sum(e.num_accepted_draft_tokens for e in events), last.finish_reason, last.usage,
        logprobs=[lp for e in events for lp in e.logprobs],
        prompt_logprobs=[lp for e in events for lp in e.prompt_logprobs])
