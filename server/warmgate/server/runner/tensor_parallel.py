"""The communicator the model calls at TP > 1, and the shard each rank reads of each tensor.

The model holds one of these (or None at TP=1, where it calls nothing): row-parallel o_proj
and down_proj end in `all_reduce`, the vocab-parallel embedding is `embed` (a masked lookup of
this rank's rows, then an all-reduce) and the vocab-parallel head ends in `gather_logits`.
The weight loader asks `read_shard` for this rank's slice of each Hugging Face tensor, read
from the file as a slice (safetensors get_slice), never the whole tensor.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors import safe_open

from warmgate.server.config.weight_files import TensorEntry
from warmgate.server.runner.shard_layout import ShardLayout

# Hugging Face tensor name suffix -> (dim split, which layout slice); unlisted names
# (norms, q_norm/k_norm) are replicated whole on every rank.
_SPLITS = {
    "self_attn.q_proj.weight": (0, "q_rows"), "self_attn.q_proj.bias": (0, "q_rows"),
    "self_attn.k_proj.weight": (0, "kv_rows"), "self_attn.k_proj.bias": (0, "kv_rows"),
    "self_attn.v_proj.weight": (0, "kv_rows"), "self_attn.v_proj.bias": (0, "kv_rows"),
    "self_attn.o_proj.weight": (1, "q_rows"),
    "mlp.gate_proj.weight": (0, "mlp_rows"), "mlp.up_proj.weight": (0, "mlp_rows"),
    "mlp.down_proj.weight": (1, "mlp_rows"),
    "embed_tokens.weight": (0, "vocab_slice"), "lm_head.weight": (0, "vocab_slice"),
}


def _split_of(name: str) -> tuple[int, str] | None:
    for suffix, split in _SPLITS.items():
        if name.endswith(suffix):
            return split
    return None


# A communicator set-up: (what was first used, e.g. "all_reduce bfloat16 on default", and the
# seconds that first call took).
FirstUse = Callable[[str, float], None]


class TensorParallel:
    """This rank's layout and its collectives over `group` (None: the default group).

    Every collective kind (op, dtype, group) is noted the first time it runs: that first call
    is when NCCL or gloo sets up what the kind needs (the distributed warmup phase makes them
    all before ready). `on_first_use` (the runner's JIT monitor) hears of each one."""

    def __init__(self, layout: ShardLayout, group: Any = None) -> None:
        self.layout = layout
        self.group = group
        self.rank = layout.rank
        self.size = layout.size
        # A gloo group for Python objects (per-rank timings) when `group` is NCCL's.
        self.object_group: Any = None
        self.on_first_use: FirstUse | None = None
        self._used: set[tuple[str, object, int]] = set()

    def _first_use(self, op: str, dtype: object, group: Any) -> tuple[str, float] | None:
        """None for a kind already used (one set lookup: this is on every layer's path)."""
        key = (op, dtype, id(group))
        if key in self._used:
            return None
        self._used.add(key)
        name = "default" if group is None else ("objects" if group is self.object_group
                                                else f"group {id(group):x}")
        return f"{op} {str(dtype).removeprefix('torch.')} on {name}", time.perf_counter()

    def _set_up(self, first: tuple[str, float] | None) -> None:
        if first is not None and self.on_first_use is not None:
            self.on_first_use(first[0], time.perf_counter() - first[1])

    # --- collectives on the forward path -------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of every rank's partial result (row-parallel projections), in place."""
        first = self._first_use("all_reduce", x.dtype, self.group)
        dist.all_reduce(x, group=self.group)
        self._set_up(first)
        return x

    def embed(self, input_ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> [T, H]: each rank looks up the ids in its vocabulary block (zero
        for the others), and the all-reduce leaves every rank with the full rows."""
        local = input_ids - self.layout.vocab_start
        outside = (local < 0) | (local >= self.layout.vocab_rows)
        hidden = F.embedding(local.masked_fill(outside, 0), weight)
        return self.all_reduce(hidden.masked_fill(outside.unsqueeze(-1), 0.0))

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[N, V/N] on each rank -> [N, V] on every rank (padding rows dropped)."""
        parts = [torch.empty_like(logits) for _ in range(self.size)]
        first = self._first_use("all_gather", logits.dtype, self.group)
        dist.all_gather(parts, logits.contiguous(), group=self.group)
        self._set_up(first)
        return torch.cat(parts, dim=-1)[:, :self.layout.vocab_size]

    def gather_objects(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order (warmup timings; never on a step's path)."""
        gathered: list[Any] = [None] * self.size
        first = self._first_use("all_gather_object", "object", self.object_group)
        dist.all_gather_object(gathered, value, group=self.object_group)
        self._set_up(first)
        return gathered

    # --- weights ----------------------------------------------------------------------------
    def shard_copies(self, copies: list[tuple[Path, TensorEntry, torch.Tensor]]
                     ) -> tuple[list[tuple[Path, TensorEntry, torch.Tensor]],
                                list[tuple[Path, str, torch.Tensor]]]:
        """The weight loader's (file, header entry, target) copies cut to this rank's shard:
        a block of rows is a contiguous byte range, so it stays a streamed copy of just those
        bytes; a block of columns (o_proj, down_proj) is strided, returned apart for
        read_column_blocks. Replicated tensors are unchanged."""
        streamed: list[tuple[Path, TensorEntry, torch.Tensor]] = []
        columns: list[tuple[Path, str, torch.Tensor]] = []
        for path, entry, target in copies:
            split = _split_of(entry.name)
            if split is None:
                streamed.append((path, entry, target))
                continue
            dim, which = split
            if dim == 1:
                columns.append((path, entry.name, target))
                continue
            rows: slice = getattr(self.layout, which)
            n = rows.stop - rows.start
            row_bytes = (entry.end - entry.begin) // entry.shape[0]
            part = dataclasses.replace(entry, begin=entry.begin + rows.start * row_bytes,
                                       end=entry.begin + rows.stop * row_bytes,
                                       shape=(n, *entry.shape[1:]))
            # Only the vocabulary's last block is shorter than its parameter: zero rows give
            # zero logits, which gather_logits cuts off, and ids never reach them.
            target.narrow(0, n, target.shape[0] - n).zero_()
            streamed.append((path, part, target.narrow(0, 0, n)))
        return streamed, columns

    def read_column_blocks(self, columns: list[tuple[Path, str, torch.Tensor]]) -> None:
        """Each (file, name, target): this rank's block of the tensor's columns, read as a
        safetensors slice (never the whole tensor)."""
        by_file: dict[Path, list[tuple[str, torch.Tensor]]] = {}
        for path, name, target in columns:
            by_file.setdefault(path, []).append((name, target))
        for path, tensors in by_file.items():
            with safe_open(str(path), framework="pt") as handle:
                for name, target in tensors:
                    split = _split_of(name)
                    assert split is not None and split[0] == 1  # from shard_copies
                    cols: slice = getattr(self.layout, split[1])
                    target.copy_(handle.get_slice(name)[:, cols])

    def take(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a full-size tensor under an HF name (seeded random weights,
        which every rank draws in full, in the same order, so the shards match TP=1's)."""
        split = _split_of(name)
        if split is None:
            return full
        dim, which = split
        return full.narrow(dim, getattr(self.layout, which).start,
                           _length(getattr(self.layout, which)))

    @staticmethod
    def _copy_padded(target: torch.Tensor, part: torch.Tensor, dim: int) -> None:
        # Only the vocabulary's last block is shorter than its parameter: zero rows give
        # zero logits, which gather_logits cuts off, and ids never reach them.
        n = part.shape[dim]
        target.narrow(dim, 0, n).copy_(part)
        if n < target.shape[dim]:
            target.narrow(dim, n, target.shape[dim] - n).zero_()

    def copy_take(self, name: str, full: torch.Tensor, target: torch.Tensor) -> None:
        split = _split_of(name)
        self._copy_padded(target, self.take(name, full), 0 if split is None else split[0])


def _length(s: slice) -> int:
    return s.stop - s.start
