"""What each logits row of a step is sampled with: its request's parameters and the tokens it
is conditioned on (for penalties and min_tokens)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain

import torch

from warmgate.server.runner.scheduler_output import SamplingParams


@dataclass(frozen=True)
class TokenHistory:
    """A row's context: the request's prompt, the tokens it generated, and (for the row of
    draft position j in speculative verification) the j drafts before it, which count as
    generated because the row's token is only kept if they are accepted. The lists are the
    request's own, read (never copied) only by the processors that need them."""

    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()
    drafts: Sequence[int] = ()

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids) + len(self.drafts)

    def output_tokens(self) -> Iterator[int]:
        return chain(self.output_token_ids, self.drafts)

    def all_tokens(self) -> Iterator[int]:
        return chain(self.prompt_token_ids, self.output_token_ids, self.drafts)

    def with_drafts(self, drafts: Sequence[int]) -> TokenHistory:
        return TokenHistory(self.prompt_token_ids, self.output_token_ids, drafts)


NO_HISTORY = TokenHistory()


@dataclass(frozen=True)
class SamplingRows:
    """One entry per logits row, in row order."""

    params: Sequence[SamplingParams]
    histories: Sequence[TokenHistory]
    device: torch.device

    @classmethod
    def of(cls, params: Sequence[SamplingParams], histories: Sequence[TokenHistory] | None,
           device: torch.device) -> SamplingRows:
        return cls(params, histories if histories is not None else [NO_HISTORY] * len(params),
                   device)

    @classmethod
    def for_verify(cls, params: Sequence[SamplingParams],
                   histories: Sequence[TokenHistory] | None,
                   draft_token_ids: Sequence[Sequence[int]], device: torch.device
                   ) -> SamplingRows:
        """Request i owns k_i + 1 rows; its row j is conditioned on drafts[:j] as well."""
        hist = histories if histories is not None else [NO_HISTORY] * len(params)
        row_params, row_hist = [], []
        for p, h, d in zip(params, hist, draft_token_ids, strict=True):
            for j in range(len(d) + 1):
                row_params.append(p)
                row_hist.append(h.with_drafts(d[:j]) if j else h)
        return cls(row_params, row_hist, device)

    def __len__(self) -> int:
        return len(self.params)
