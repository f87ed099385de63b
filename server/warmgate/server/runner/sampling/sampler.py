"""Token sampling and speculative verification, vectorised over the batch, as a pipeline:
rows (parameters and token histories) -> logits processors -> greedy choice or warpers and
the race (-> for verification, the leading accepted drafts)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from warmgate.server.runner.sampling.drafts import DraftLayout
from warmgate.server.runner.sampling.grammar_mask import apply_token_bitmask
from warmgate.server.runner.sampling.processors import apply_logits_processors
from warmgate.server.runner.sampling.rows import SamplingRows, TokenHistory
from warmgate.server.runner.sampling.seeded import SeededStream
from warmgate.server.runner.sampling.warper_ops import TORCH_WARPER_OPS, WarperOps
from warmgate.server.runner.sampling.warpers import choose_tokens
from warmgate.server.runner.scheduler_output import SamplingParams

LogSoftmax = Callable[[torch.Tensor], torch.Tensor]


def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1)


class Sampler:
    def __init__(self, log_softmax: LogSoftmax = _log_softmax, row_wise: bool = False,
                 warper_ops: WarperOps = TORCH_WARPER_OPS) -> None:
        """log_softmax: [R, V] -> float32 [R, V], the logprobs' normaliser (the runner's ops:
        batch invariant under --deterministic). row_wise (--deterministic): a seeded row's
        draw depends only on its logits and (seed, position), never on the rows beside it:
        the sampled rows are drawn together when `warper_ops` (the warpers' softmax, cumsum
        and top-k) are batch invariant, else each alone."""
        self.log_softmax = log_softmax
        self.row_wise = row_wise
        self.warper_ops = warper_ops

    def sample(self, logits: torch.Tensor, params: Sequence[SamplingParams],
               streams: Sequence[SeededStream | None],
               histories: Sequence[TokenHistory] | None = None,
               token_bitmask: torch.Tensor | None = None) -> torch.Tensor:
        """logits: [N, V] float32 or the model's dtype, left unchanged (the greedy argmax reads
        them as they are, everything else computes in float32); params, streams, histories
        (None: no tokens yet): one per row -> tokens [N] int64; token_bitmask: structured
        output's rows (see apply_token_bitmask), or None."""
        x = apply_token_bitmask(logits, token_bitmask)
        if any(p.uses_logits_processors for p in params):
            x = apply_logits_processors(x, SamplingRows.of(params, histories,
                                                                logits.device))
        gens = [s.generators(1, logits.device)[0] if s is not None else None for s in streams]
        return choose_tokens(x, params, gens, self.row_wise, self.warper_ops)

    def verify(self, logits: torch.Tensor, draft_token_ids: Sequence[Sequence[int]],
               params: Sequence[SamplingParams], streams: Sequence[SeededStream | None],
               histories: Sequence[TokenHistory] | None = None,
               token_bitmask: torch.Tensor | None = None,
               ) -> tuple[list[list[int]], list[int]]:
        """Speculative verification against a deterministic (one-hot) drafter.

        logits: [sum(k_i + 1), V], request i owning k_i draft rows then its bonus row;
        draft_token_ids, params, streams, histories: one per request. Returns per request the
        tokens to append (accepted drafts, then the target's token at the first rejected row
        or the bonus row) and the number of drafts accepted.

        Every row draws its own token from the target (the argmax for greedy requests, the
        race for stochastic ones), after the same processors as a plain step with the drafts
        before it counted as generated, and a draft is accepted while it equals that token.
        For a stochastic request this is rejection sampling with the draft accepted with
        probability p(d) and, on rejection, a draw from p without d, so the output is
        distributed as p; and since each position's token is drawn whether or not a draft
        sits there, a seeded request emits exactly the tokens it would without speculation.
        With a grammar, row j's bitmask is the grammar's state after the request's first j
        drafts (serving/grammar/matcher.py), so every token drawn is one the grammar allows
        at its position.
        """
        dev = logits.device
        layout = DraftLayout.of(draft_token_ids, logits.shape[0], dev)
        row_params = [p for p, d in zip(params, draft_token_ids, strict=True)
                      for _ in range(len(d) + 1)]
        x = apply_token_bitmask(logits, token_bitmask)
        if any(p.uses_logits_processors for p in params):
            x = apply_logits_processors(x, SamplingRows.for_verify(
                params, histories, draft_token_ids, dev))
        gens = [g for s, d in zip(streams, draft_token_ids, strict=True)
                for g in (s.generators(len(d) + 1, dev) if s is not None
                          else [None] * (len(d) + 1))]
        return layout.accept(choose_tokens(x, row_params, gens, self.row_wise,
                                           self.warper_ops))
