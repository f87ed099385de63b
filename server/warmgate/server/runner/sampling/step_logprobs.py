"""The log probabilities one step returns: of the tokens it sampled (per request, over that
request's logits rows) and of the prompt tokens its prefill chunks read.

Prompt logprobs need the logits of prompt positions the sampler never sees: the hidden row of
prompt position p predicts prompt token p + 1. They go through the language-model head in
slices of at most `max_rows` rows, so their logits never take more memory than a full
sampling step's; every slice is a head GEMM of at most max_num_batched_tokens rows, a shape
the warmup's shape sweep ran.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from warmgate.server.runner.request_state import ScheduledRequest
from warmgate.server.runner.sampling.logprobs import gather_logprobs
from warmgate.server.runner.scheduler_output import PromptLogprobs, TokenLogprobs

LogSoftmax = Callable[[torch.Tensor], torch.Tensor]


def sampled_logprobs(logits: torch.Tensor, sampling: Sequence[ScheduledRequest],
                     tokens: Sequence[Sequence[int]], log_softmax: LogSoftmax | None = None,
                     ) -> list[list[TokenLogprobs]] | None:
    """Per sampling request, one entry per appended token (its k_i + 1 rows start at the sum
    of the earlier requests' rows); None when no request asked."""
    wanted = [s.state.sampling_params.logprobs if s.state.sampling_params else None
              for s in sampling]
    if all(n is None for n in wanted):
        return None
    rows: list[int] = []
    ids: list[int] = []
    tops: list[int] = []
    first = 0
    for s, n, toks in zip(sampling, wanted, tokens, strict=True):
        if n is not None:
            rows += range(first, first + len(toks))
            ids += toks
            tops += [n] * len(toks)
        first += s.num_logits_rows
    flat = iter(gather_logprobs(logits, rows, ids, tops, log_softmax))
    return [[next(flat) for _ in toks] if n is not None else []
            for n, toks in zip(wanted, tokens, strict=True)]


def prompt_logprobs(hidden: torch.Tensor, scheduled: Sequence[ScheduledRequest],
                    query_starts: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor],
                    max_rows: int, log_softmax: LogSoftmax | None = None,
                    ) -> dict[str, PromptLogprobs]:
    """For every request that asked and whose step reads prompt positions p with p + 1 still
    in the prompt: those positions' logprobs. hidden [T, H]; query_starts [R + 1] on the host."""
    out: dict[str, PromptLogprobs] = {}
    for i, s in enumerate(scheduled):
        params = s.state.sampling_params
        if params is None or params.prompt_logprobs is None:
            continue
        prompt = s.state.prompt_token_ids
        start = s.num_computed_tokens
        end = min(start + s.num_scheduled_tokens - s.num_draft_tokens, len(prompt) - 1)
        if end <= start:
            continue
        entries: list[TokenLogprobs] = []
        for lo in range(start, end, max_rows):
            hi = min(lo + max_rows, end)
            first_row = int(query_starts[i]) + lo - start
            logits = head(hidden[first_row:first_row + hi - lo])
            entries += gather_logprobs(logits, range(hi - lo), prompt[lo + 1:hi + 1],
                                       [params.prompt_logprobs] * (hi - lo), log_softmax)
        out[s.req_id] = PromptLogprobs(start, entries)
    return out
