"""Logits processors: the steps that change a row's logits before its token is chosen.

`apply_logits_processors` is the one place they run, in LOGITS_PROCESSORS order (vLLM V1's:
bias and min_tokens, then the penalties); a later step, such as a structured-output bitmask,
is one more entry at the end. Each processor runs only when some row of the batch needs it
and touches only those rows, so a batch without options returns its logits untouched (the
same tensor, no copy) and one request's options cost the others nothing but a Python check.

Formulas (all on float32 logits, rows indexed by r, tokens by t):
- logit_bias: x[r, t] += bias[t] (transformers' SequenceBiasLogitsProcessor for one-token
  sequences; OpenAI's logit_bias);
- min_tokens: x[r, t] = -inf for every stop id t while the row has generated fewer than
  min_tokens tokens (transformers' MinNewTokensLengthLogitsProcessor);
- repetition_penalty p (transformers' RepetitionPenaltyLogitsProcessor, on prompt and
  generated tokens): x[r, t] = x / p if x > 0 else x * p, for every t seen;
- presence / frequency (OpenAI's, on generated tokens only, c = count of t so far):
  x[r, t] -= frequency * c + presence * (c > 0).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import torch

from warmgate.server.runner.host_copy import to_device
from warmgate.server.runner.sampling.rows import SamplingRows


class LogitsProcessor(Protocol):
    name: str

    def applies(self, rows: SamplingRows, i: int) -> bool:
        """Whether row i needs this processor (False: its logits stay as they are)."""

    def apply(self, logits: torch.Tensor, rows: SamplingRows, which: list[int]) -> None:
        """Change `logits` [N, V] in place on the rows `which`."""


def _scatter_index(pairs_rows: list[int], pairs_tokens: list[int], device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and token indices in one host->device copy."""
    both = to_device(pairs_rows + pairs_tokens, torch.long, device)
    return both[:len(pairs_rows)], both[len(pairs_rows):]


class LogitBias:
    name = "logit_bias"

    def applies(self, rows: SamplingRows, i: int) -> bool:
        return bool(rows.params[i].logit_bias)

    def apply(self, logits: torch.Tensor, rows: SamplingRows, which: list[int]) -> None:
        r = [i for i in which for _ in rows.params[i].logit_bias]
        t = [tok for i in which for tok, _ in rows.params[i].logit_bias]
        bias = to_device([b for i in which for _, b in rows.params[i].logit_bias],
                         torch.float32, logits.device)
        logits.index_put_(_scatter_index(r, t, logits.device), bias, accumulate=True)


class MinTokens:
    name = "min_tokens"

    def applies(self, rows: SamplingRows, i: int) -> bool:
        p = rows.params[i]
        return bool(p.stop_token_ids) and rows.histories[i].num_output_tokens < p.min_tokens

    def apply(self, logits: torch.Tensor, rows: SamplingRows, which: list[int]) -> None:
        r = [i for i in which for _ in rows.params[i].stop_token_ids]
        t = [tok for i in which for tok in rows.params[i].stop_token_ids]
        logits[_scatter_index(r, t, logits.device)] = float("-inf")


def _penalised_rows(logits: torch.Tensor, which: list[int]) -> tuple[torch.Tensor,
                                                                     torch.Tensor]:
    rows_t = to_device(which, torch.long, logits.device)
    return rows_t, logits.index_select(0, rows_t)  # [Np, V], a copy


def _history_pairs(which: list[int], tokens_of: Callable[[int], Iterable[int]]
                   ) -> tuple[list[int], list[int]]:
    """(position in `which`, token id) for every token of each penalised row's history."""
    r: list[int] = []
    t: list[int] = []
    for j, i in enumerate(which):
        tokens = list(tokens_of(i))
        r += [j] * len(tokens)
        t += tokens
    return r, t


class RepetitionPenalty:
    name = "repetition_penalty"

    def applies(self, rows: SamplingRows, i: int) -> bool:
        return rows.params[i].repetition_penalty != 1.0

    def apply(self, logits: torch.Tensor, rows: SamplingRows, which: list[int]) -> None:
        rows_t, sub = _penalised_rows(logits, which)
        r, t = _history_pairs(which, lambda i: rows.histories[i].all_tokens())
        seen = torch.zeros_like(sub, dtype=torch.bool)
        seen[_scatter_index(r, t, logits.device)] = True
        penalty = to_device([rows.params[i].repetition_penalty for i in which], torch.float32,
                            logits.device)[:, None]
        penalised = torch.where(sub > 0, sub / penalty, sub * penalty)
        logits.index_copy_(0, rows_t, torch.where(seen, penalised, sub))


class PresenceFrequencyPenalty:
    name = "presence_frequency_penalty"

    def applies(self, rows: SamplingRows, i: int) -> bool:
        p = rows.params[i]
        return p.presence_penalty != 0.0 or p.frequency_penalty != 0.0

    def apply(self, logits: torch.Tensor, rows: SamplingRows, which: list[int]) -> None:
        rows_t, sub = _penalised_rows(logits, which)
        r, t = _history_pairs(which, lambda i: rows.histories[i].output_tokens())
        counts = torch.zeros_like(sub)
        if t:
            counts.index_put_(_scatter_index(r, t, logits.device),
                              torch.ones(len(t), device=logits.device), accumulate=True)
        weights = to_device([v for i in which for v in (rows.params[i].frequency_penalty,
                                                        rows.params[i].presence_penalty)],
                            torch.float32, logits.device).view(-1, 2)
        sub -= weights[:, :1] * counts + weights[:, 1:] * (counts > 0)
        logits.index_copy_(0, rows_t, sub)


LOGITS_PROCESSORS: tuple[LogitsProcessor, ...] = (
    LogitBias(), MinTokens(), RepetitionPenalty(), PresenceFrequencyPenalty())


def apply_logits_processors(logits: torch.Tensor, rows: SamplingRows,
                            processors: Sequence[LogitsProcessor] = LOGITS_PROCESSORS
                            ) -> torch.Tensor:
    """The logits after every processor some row needs; `logits` itself when none applies
    (it is never changed: the raw logits also serve logprobs)."""
    out = logits
    for proc in processors:
        which = [i for i in range(len(rows)) if proc.applies(rows, i)]
        if not which:
            continue
        if out is logits:  # processors compute in float32, whatever the logits' dtype
            out = logits.to(torch.float32, copy=True)
        proc.apply(out, rows, which)
    return out
