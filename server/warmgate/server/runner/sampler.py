"""Token sampling and speculative verification, vectorised over the batch.

Sampling draws with the exponential race (argmax of p / q with q ~ Exp(1) is a draw from p),
which needs no normalised distribution and lets every row take its own noise. A seeded
request's noise for output position n comes only from a generator seeded with (seed, n), so
its tokens depend neither on its batch companions nor on how its positions were split into
steps (preemption, a token budget trimming its drafts, a warmup in between, k itself).
An all-greedy batch never draws random numbers (vLLM issue 54455 was that path left cold).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from warmgate.server.runner.host_copy import to_device
from warmgate.server.runner.scheduler_output import SamplingParams

_MASK64 = (1 << 64) - 1


def _mix(seed: int, position: int) -> int:
    """splitmix64 of (seed, position): neighbouring positions get unrelated generator states."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1  # manual_seed takes a non-negative int64


def make_generator(seed: int, position: int, device: torch.device) -> torch.Generator:
    """The generator for one seeded request's output position."""
    gen = torch.Generator(device=device)
    gen.manual_seed(_mix(seed, position))
    return gen


@dataclass(frozen=True)
class SeededStream:
    """A seeded request's random stream from the first position this step samples: the
    logits row for output position `start + j` draws only from make_generator(seed, start + j)."""

    seed: int
    start: int

    def generators(self, num_rows: int, device: torch.device) -> list[torch.Generator]:
        return [make_generator(self.seed, self.start + j, device) for j in range(num_rows)]


class Sampler:
    def sample(self, logits: torch.Tensor, params: Sequence[SamplingParams],
               streams: Sequence[SeededStream | None]) -> torch.Tensor:
        """logits: [N, V] float32; params, streams: one per row -> tokens [N] int64."""
        greedy = logits.argmax(dim=-1)
        if all(p.is_greedy for p in params):
            return greedy
        probs = self._probs(logits, params)
        gens = [s.generators(1, logits.device)[0] if s is not None else None for s in streams]
        sampled = (probs / self._noise(probs, gens)).argmax(dim=-1)
        return self._where_greedy(params, greedy, sampled)

    def verify(self, logits: torch.Tensor, draft_token_ids: Sequence[Sequence[int]],
               params: Sequence[SamplingParams],
               streams: Sequence[SeededStream | None]) -> tuple[list[list[int]], list[int]]:
        """Speculative verification against a deterministic (one-hot) drafter.

        logits: [sum(k_i + 1), V], request i owning k_i draft rows then its bonus row;
        draft_token_ids, params, streams: one per request. Returns per request the tokens
        to append (accepted drafts, then the target's token at the first rejected row or the
        bonus row) and the number of drafts accepted.

        Every row draws its own token from the target (the argmax for greedy requests, the
        race for stochastic ones) and a draft is accepted while it equals that token. For a
        stochastic request this is rejection sampling with the draft accepted with
        probability p(d) and, on rejection, a draw from p without d, so the output is
        distributed as p; and since each position's token is drawn whether or not a draft
        sits there, a seeded request emits exactly the tokens it would without speculation.
        """
        dev = logits.device
        ks = [len(d) for d in draft_token_ids]
        starts = [0]
        for k in ks:
            starts.append(starts[-1] + k + 1)
        if starts[-1] != logits.shape[0]:
            raise ValueError(f"verify: {logits.shape[0]} logits rows for {sum(ks)} drafts "
                             f"over {len(ks)} requests (expected {starts[-1]})")
        row_params = [p for p, k in zip(params, ks, strict=True) for _ in range(k + 1)]
        draft_rows = [starts[i] + j for i, k in enumerate(ks) for j in range(k)]
        draft_req = [i for i, k in enumerate(ks) for _ in range(k)]
        draft_pos = [j for k in ks for j in range(k)]
        flat_drafts = [t for d in draft_token_ids for t in d]
        # Every index list in one host->device copy, split on the device.
        nd, nr = len(draft_rows), len(ks)
        packed = to_device(draft_rows + flat_drafts + draft_req + draft_pos + starts[:-1],
                           torch.long, dev)
        rows_t, drafts_t, req_t, pos_t, starts_t = packed.split([nd, nd, nd, nd, nr])

        final = logits.argmax(dim=-1)  # [M]
        if not all(p.is_greedy for p in params):
            probs = self._probs(logits, row_params)  # [M, V]
            row_gens = [g for s, k in zip(streams, ks, strict=True)
                        for g in (s.generators(k + 1, dev) if s is not None
                                  else [None] * (k + 1))]
            sampled = (probs / self._noise(probs, row_gens)).argmax(dim=-1)
            final = self._where_greedy(row_params, final, sampled)
        accept = final[rows_t] == drafts_t  # [num_drafts]

        max_k = max(ks, default=0)
        accepted = torch.zeros(len(ks), max_k, dtype=torch.int32, device=dev)  # [R, K]
        if draft_rows:
            accepted[req_t, pos_t] = accept.int()
        num_accepted = accepted.cumprod(dim=1).sum(dim=1)  # leading accepts, [R]
        tokens = final[starts_t + num_accepted]  # [R]
        host = torch.stack([num_accepted.long(), tokens]).tolist()  # the step's one sync
        out = [[*d[:a], t] for d, a, t in zip(draft_token_ids, host[0], host[1],
                                                    strict=True)]
        return out, host[0]

    @staticmethod
    def _where_greedy(params: Sequence[SamplingParams], greedy: torch.Tensor,
                      sampled: torch.Tensor) -> torch.Tensor:
        if not any(p.is_greedy for p in params):
            return sampled
        mask = to_device([p.is_greedy for p in params], torch.bool, greedy.device)
        return torch.where(mask, greedy, sampled)

    @staticmethod
    def _probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
        """Temperature, then top-k, then top-p over what top-k kept; [N, V] probabilities.
        Greedy rows get temperature 1 so they stay finite (their result is the argmax)."""
        dev = logits.device
        temps = to_device([1.0 if p.is_greedy else p.temperature for p in params],
                          torch.float32, dev)
        x = logits / temps[:, None]
        use_top_k = any(p.top_k > 0 for p in params)
        use_top_p = any(p.top_p < 1.0 for p in params)
        if use_top_k or use_top_p:
            x = _top_k_top_p(x, params)
        return torch.softmax(x, dim=-1)

    @staticmethod
    def _noise(probs: torch.Tensor, generators: Sequence[torch.Generator | None],
               ) -> torch.Tensor:
        noise = torch.empty_like(probs).exponential_()
        for i, gen in enumerate(generators):
            if gen is not None:
                noise[i].exponential_(generator=gen)
        # exponential_ can return exactly 0 on some devices; p / 0 would win every race.
        return noise.clamp_min_(torch.finfo(noise.dtype).tiny)


def _top_k_top_p(x: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    dev = x.device
    vocab = x.shape[-1]
    top_k = to_device([p.top_k if 0 < p.top_k < vocab else vocab for p in params],
                      torch.long, dev)
    top_p = to_device([p.top_p for p in params], torch.float32, dev)
    sorted_x, order = x.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=dev)
    sorted_x = sorted_x.masked_fill(ranks[None, :] >= top_k[:, None], float("-inf"))
    p = torch.softmax(sorted_x, dim=-1)
    mass_before = p.cumsum(dim=-1) - p
    # Drop a token once the tokens above it already hold top_p: the smallest nucleus whose
    # mass reaches top_p. Rows with top_p 1 are left alone (a float cumsum can pass 1.0).
    drop = (mass_before >= top_p[:, None]) & (top_p < 1.0)[:, None]
    drop[:, 0] = False
    sorted_x = sorted_x.masked_fill(drop, float("-inf"))
    return torch.empty_like(x).scatter_(-1, order, sorted_x)
