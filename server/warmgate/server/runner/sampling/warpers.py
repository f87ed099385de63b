"""From processed logits to a token: the greedy choice, or temperature, min_p, top-k, top-p
and the exponential race.

The race (argmax of p / q with q ~ Exp(1) is a draw from p) needs no normalised distribution
and lets every row take its own noise. Greedy rows take the argmax; warpers never change it.
The row operations a batch could change (softmax, cumsum, the sorted top of a row) come from
a WarperOps object: torch's by default (sampling/warper_ops.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from warmgate.server.runner.host_copy import to_device
from warmgate.server.runner.sampling.warper_ops import TORCH_WARPER_OPS, WarperOps
from warmgate.server.runner.scheduler_output import SamplingParams


def choose_tokens(x: torch.Tensor, params: Sequence[SamplingParams],
                  generators: Sequence[torch.Generator | None],
                  row_wise: bool = False,
                  ops: WarperOps = TORCH_WARPER_OPS) -> torch.Tensor:
    """One token per row of x [N, V]: the argmax for greedy rows, a draw for the others. An
    all-greedy batch never draws random numbers (vLLM issue 54455 was that path left cold).
    row_wise (--deterministic): a drawn row's token must not depend on the other rows. With
    batch-invariant ops the rows are drawn together anyway; otherwise each drawn row's
    softmax, sort and cumsum run on it alone, whose kernels then cannot pick another split
    for another row count (nor its top-k width follow another row's k)."""
    greedy = ops.argmax(x)
    if all(p.is_greedy for p in params):
        return greedy
    if row_wise and not ops.batch_invariant:
        return torch.cat([greedy[i:i + 1] if p.is_greedy
                          else _draw(x[i:i + 1].clone(), [p], [generators[i]], ops)
                          for i, p in enumerate(params)])
    sampled = _draw(x, params, generators, ops)
    if not any(p.is_greedy for p in params):
        return sampled
    mask = to_device([p.is_greedy for p in params], torch.bool, greedy.device)
    return torch.where(mask, greedy, sampled)


def _draw(x: torch.Tensor, params: Sequence[SamplingParams],
          generators: Sequence[torch.Generator | None],
          ops: WarperOps) -> torch.Tensor:
    """The race's winner per row of x [N, V] -> [N]."""
    probs = probabilities(x, params, ops)
    return ops.argmax(probs / _noise(probs, generators))


def probabilities(x: torch.Tensor, params: Sequence[SamplingParams],
                  ops: WarperOps = TORCH_WARPER_OPS) -> torch.Tensor:
    """Temperature, then min_p, then top-k, then top-p over what top-k kept (vLLM V1's order);
    [N, V] probabilities. Greedy rows get temperature 1 so they stay finite."""
    dev = x.device
    temps = to_device([1.0 if p.is_greedy else p.temperature for p in params],
                      torch.float32, dev)
    x = x / temps[:, None]
    if any(p.min_p > 0.0 for p in params):
        x = min_p_filter(x, to_device([p.min_p for p in params], torch.float32, dev), ops)
    if any(p.top_k > 0 for p in params) or any(p.top_p < 1.0 for p in params):
        x = top_k_top_p(x, params, ops)
    return ops.softmax(x)


def min_p_filter(x: torch.Tensor, min_p: torch.Tensor,
                 ops: WarperOps = TORCH_WARPER_OPS) -> torch.Tensor:
    """-inf where a token's probability is below min_p times the row's largest (rows with
    min_p 0 keep everything; the most likely token always stays)."""
    probs = ops.softmax(x)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p[:, None]
    return x.masked_fill(probs < threshold, float("-inf"))


def top_k_top_p(x: torch.Tensor, params: Sequence[SamplingParams],
                ops: WarperOps = TORCH_WARPER_OPS) -> torch.Tensor:
    """x [N, V] with -inf outside each row's top-k, then outside the smallest nucleus of what
    top-k kept whose mass reaches top_p.

    When every sampled row has a top-k, only the `width` (largest k) best tokens of a row can
    survive, so ops.top finds them instead of a sort of the whole vocabulary (on a 128k
    vocabulary the sort is most of the sampler's time). Greedy rows take their argmax whatever
    this returns for them, so their k never widens the search. The nucleus passes (softmax,
    cumsum, mask) only run when some row has top_p < 1.
    """
    dev = x.device
    vocab = x.shape[-1]
    ks = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
    width = max((k for k, p in zip(ks, params, strict=True) if not p.is_greedy), default=1)
    top_k = to_device([min(k, width) for k in ks], torch.long, dev)
    sorted_x, order = ops.top(x, width)  # [N, width], largest first
    ranks = torch.arange(width, device=dev)
    sorted_x = sorted_x.masked_fill(ranks[None, :] >= top_k[:, None], float("-inf"))
    if any(p.top_p < 1.0 for p in params):
        top_p = to_device([p.top_p for p in params], torch.float32, dev)
        probs = ops.softmax(sorted_x)
        mass_before = ops.cumsum(probs) - probs
        # Drop a token once the tokens above it already hold top_p: the smallest nucleus
        # whose mass reaches top_p. Rows with top_p 1 are left alone (a float cumsum can
        # pass 1.0).
        drop = (mass_before >= top_p[:, None]) & (top_p < 1.0)[:, None]
        drop[:, 0] = False
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
    if width == vocab:  # `order` is a permutation of the whole row
        return torch.empty_like(x).scatter_(-1, order, sorted_x)
    return torch.full_like(x, float("-inf")).scatter_(-1, order, sorted_x)


def _noise(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    noise = torch.empty_like(probs).exponential_()
    for i, gen in enumerate(generators):
        if gen is not None:
            noise[i].exponential_(generator=gen)
    # exponential_ can return exactly 0 on some devices; p / 0 would win every race.
    return noise.clamp_min_(torch.finfo(noise.dtype).tiny)
