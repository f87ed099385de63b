"""The two reductions along a row that the warpers compute with: softmax and cumsum.

They are the only steps of a draw whose arithmetic order a kernel may choose by the batch's
row count; everything else (element-wise ops, amax, argmax, topk/sort, scatter, masked_fill,
each seeded row's own noise) gives a row the same bits in any batch. So the warpers take them
as one object: torch's by default, or kernels that reduce each row in an order fixed by its
length alone (kernels/row_reductions.py, --deterministic on CUDA), with which the sampled rows
can be drawn together and still each depend on its own logits only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

RowFn = Callable[[torch.Tensor], torch.Tensor]


def _torch_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def _torch_cumsum(x: torch.Tensor) -> torch.Tensor:
    return x.cumsum(dim=-1)


@dataclass(frozen=True)
class RowReductions:
    """softmax, cumsum: float32 [N, W] -> float32 [N, W] along the last dimension.
    batch_invariant: whether a row's result is the same bits whatever the other rows are (if
    not, --deterministic draws each sampled row alone)."""

    softmax: RowFn
    cumsum: RowFn
    batch_invariant: bool
    name: str


TORCH_REDUCTIONS = RowReductions(_torch_softmax, _torch_cumsum, batch_invariant=False,
                                 name="torch")
