"""Token sampling and speculative verification, vectorised over the batch.

Sampling draws with the exponential race (argmax of p / q with q ~ Exp(1) is a draw from p),
which needs no normalised distribution and lets every row take its own noise: a seeded row's
noise comes only from its own generator, so its tokens do not depend on its batch companions.
An all-greedy batch never draws random numbers (vLLM issue 54455 was that path left cold).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from warmgate.server.runner.host_copy import to_device
from warmgate.server.runner.scheduler_output import SamplingParams

_MASK64 = (1 << 64) - 1


def _mix(seed: int, step: int) -> int:
    """splitmix64 of (seed, step): neighbouring steps get unrelated generator states."""
    z = (seed * 0x9E3779B97F4A7C15 + step + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1  # manual_seed takes a non-negative int64


def make_generator(seed: int, num_generated: int, device: torch.device) -> torch.Generator:
    """The generator for one seeded request's step, from its seed and how far it has got."""
    gen = torch.Generator(device=device)
    gen.manual_seed(_mix(seed, num_generated))
    return gen


class Sampler:
    def sample(self, logits: torch.Tensor, params: Sequence[SamplingParams],
               generators: Sequence[torch.Generator | None]) -> torch.Tensor:
        """logits: [N, V] float32; params, generators: one per row -> tokens [N] int64."""
        greedy = logits.argmax(dim=-1)
        if all(p.is_greedy for p in params):
            return greedy
        probs = self._probs(logits, params)
        sampled = (probs / self._noise(probs, generators)).argmax(dim=-1)
        return self._where_greedy(params, greedy, sampled)

    def verify(self, logits: torch.Tensor, draft_token_ids: Sequence[Sequence[int]],
               params: Sequence[SamplingParams],
               generators: Sequence[torch.Generator | None]) -> tuple[list[list[int]],
                                                                       list[int]]:
        """Speculative verification against a deterministic (one-hot) drafter.

        logits: [sum(k_i + 1), V], request i owning k_i draft rows then its bonus row;
        draft_token_ids, params, generators: one per request. Returns per request the tokens
        to append (accepted drafts, then one token from the first rejected row or the bonus
        row) and the number of drafts accepted. Greedy requests accept while the argmax
        equals the draft; stochastic ones accept draft d with probability p(d) and on
        rejection draw from p with d removed, which leaves the output distributed as p.
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

        greedy = logits.argmax(dim=-1)  # [M]
        accept = greedy[rows_t] == drafts_t  # [num_drafts]
        final = greedy
        if not all(p.is_greedy for p in params):
            probs = self._probs(logits, row_params)  # [M, V]
            row_gens = [g for g, k in zip(generators, ks, strict=True) for _ in range(k + 1)]
            # Per request: k uniforms first, then k + 1 noise rows, from its own generator.
            uniforms = torch.rand(len(draft_rows), device=dev)
            for i, gen in enumerate(generators):
                if gen is not None and ks[i]:
                    offset = starts[i] - i  # drafts of earlier requests
                    uniforms[offset:offset + ks[i]] = torch.rand(ks[i], device=dev,
                                                                 generator=gen)
            stochastic_accept = uniforms < probs[rows_t, drafts_t]
            row_greedy = to_device([p.is_greedy for p in row_params], torch.bool, dev)
            accept = torch.where(row_greedy[rows_t], accept, stochastic_accept)
            # Rejected at row j means d_j was not taken: draw from p without it. The bonus
            # row keeps its full distribution. The race needs no renormalisation.
            residual = probs.index_put((rows_t, drafts_t), torch.zeros((), device=dev))
            sampled = (residual / self._noise(residual, row_gens)).argmax(dim=-1)
            final = self._where_greedy(row_params, greedy, sampled)

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
