"""The three row operations of a draw whose result a batch could change: softmax, cumsum and
the sorted top of a row; and the argmax every greedy row and every draw ends in.

Everything else the warpers do (element-wise ops, amax, argmax, scatter, masked_fill, each
seeded row's own noise) gives a row the same bits in any batch. These three do not, for two
reasons: torch's softmax and cumsum kernels may pick another reduction split for another row
count; and the top-k width is the batch's largest k, so where a row's k-th value is tied,
which of the tied tokens torch.topk keeps can follow the other rows' k (bf16 logits tie often).
So the warpers take them as one object: torch's by default, or, for --deterministic on CUDA,
the one-program-per-row kernels (kernels/row_reductions.py) with `canonical_top`, with which
the sampled rows can be drawn together and each still depends on its own logits only. The
argmax is exact in any batch; it rides along because on CUDA a chunked kernel of its own
(kernels/row_argmax.py) reads a vocabulary's row many times faster than torch's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

RowFn = Callable[[torch.Tensor], torch.Tensor]
# x [N, V] -> int64 [N]: each row's largest value's first index, a NaN above every number.
ArgmaxFn = Callable[[torch.Tensor], torch.Tensor]
# (x [N, V], width) -> (values [N, width], indices [N, width]), each row largest first.
TopFn = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]

_LOW_31_BITS = 0x7FFFFFFF


def _torch_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def _torch_cumsum(x: torch.Tensor) -> torch.Tensor:
    return x.cumsum(dim=-1)


def torch_argmax(x: torch.Tensor) -> torch.Tensor:
    return x.argmax(dim=-1)


def _torch_top(x: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk for a part of the row (on a 128k vocabulary a sort of the whole row is most
    of the sampler's time), the sort for all of it."""
    if width < x.shape[-1]:
        values, indices = x.topk(width, dim=-1)
        return values, indices
    values, indices = x.sort(dim=-1, descending=True)
    return values, indices


def canonical_top(x: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `width` largest of each row of x [N, V], largest first and equal values by lower
    index: one order, so a row's first k entries are the same for any width >= k and any
    algorithm topk or sort pick. The whole row is a stable sort (the default's cost); a part
    of it is a topk over one distinct int64 key per element: the value's float32 bits made
    monotone (a negative float's magnitude bits flipped) above, V - 1 - index below."""
    x = x + 0.0  # -0.0 becomes +0.0 (IEEE): values that compare equal share one order
    vocab = x.shape[-1]
    if width >= vocab:
        values, indices = x.sort(dim=-1, descending=True, stable=True)
        return values, indices
    bits = x.float().view(torch.int32)  # [N, V]; x is a new dense tensor
    monotone = torch.where(bits < 0, bits ^ _LOW_31_BITS, bits).to(torch.int64)
    tie_break = vocab - 1 - torch.arange(vocab, device=x.device, dtype=torch.int64)  # [V]
    keys = monotone * (1 << 32) + tie_break  # [N, V]
    _, indices = keys.topk(width, dim=-1)
    return x.gather(-1, indices), indices


@dataclass(frozen=True)
class WarperOps:
    """softmax, cumsum: float32 [N, W] -> float32 [N, W] along the last dimension; top: see
    TopFn. batch_invariant: whether a row's results are the same bits whatever the other rows
    are (if not, --deterministic draws each sampled row alone). argmax: see ArgmaxFn, torch's
    unless given."""

    softmax: RowFn
    cumsum: RowFn
    top: TopFn
    batch_invariant: bool
    name: str
    argmax: ArgmaxFn = torch_argmax


TORCH_WARPER_OPS = WarperOps(_torch_softmax, _torch_cumsum, _torch_top,
                             batch_invariant=False, name="torch")


def invariant_warper_ops(softmax: RowFn, cumsum: RowFn, name: str,
                         argmax: ArgmaxFn = torch_argmax) -> WarperOps:
    """Batch-invariant warper ops from per-row softmax and cumsum kernels (their reduction
    order fixed by the row length) and canonical_top."""
    return WarperOps(softmax, cumsum, canonical_top, batch_invariant=True, name=name,
                     argmax=argmax)
