"""A step's inputs in one pinned host buffer and its device twin, sent with one copy.

A step's device inputs are seven small arrays (token ids, positions, KV slots, logits rows,
query starts, sequence lengths, the block table), plus the rows whose token the device still
holds. Sent one tensor at a time, each is a host->device copy of its own: on an H100's host
each copy_ call took about 27 us of the engine's Python at 1B, where the host, not the GPU,
set the pace (bench/results/h100-pyspy-summary-llama-3.2-1b.txt), and padding a batch to its
CUDA graph's size took six more device ops (zero_, fill_, copy_) a replay.

Here every array of a step is a region of one byte buffer, laid out for the step's padded
shape (tokens, requests): regions one after another, each aligned, so the step's bytes are
one prefix of the buffer and go over in one copy, padding included (written on the host).
The layout is a function of the shape alone, so a CUDA graph captured against a shape's
device views finds the next batch of that shape at the same addresses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Each region starts at a multiple of this many bytes: Triton specializes a kernel on whether
# a pointer argument is 16-byte aligned, and every buffer used to be its own allocation
# (256-byte aligned); a region at a lesser alignment would compile a kernel after ready.
_ALIGN = 256
# Eager shapes (any token count, any request count) keep their views cached up to this many;
# a graph's shapes are a few dozen.
_MAX_CACHED_SHAPES = 512


@dataclass(frozen=True)
class Region:
    """One array of a step: a numpy view to fill, its host tensor, and its device twin."""

    np: np.ndarray
    cpu: torch.Tensor
    gpu: torch.Tensor


@dataclass(frozen=True)
class StepViews:
    """Every region of one padded shape, and how many bytes of the buffer it spans."""

    num_tokens: int
    num_reqs: int
    input_ids: Region  # [num_tokens] int64
    positions: Region  # [num_tokens] int64
    slot_mapping: Region  # [num_tokens] int64
    logits_indices: Region  # [num_tokens] int64
    query_start_loc: Region  # [num_reqs + 1] int32
    seq_lens: Region  # [num_reqs] int32
    block_table: Region  # [num_reqs, max_blocks_per_req] int32
    # [2 * num_reqs] int64: input rows whose token is still only on the device, then each
    # one's row of the device's tokens (runner/async_output.py).
    pending: Region
    nbytes: int


# (name, dtype, shape as a function of (tokens, reqs, blocks)), in buffer order.
_LAYOUT = (
    ("input_ids", torch.int64, lambda t, r, b: (t,)),
    ("positions", torch.int64, lambda t, r, b: (t,)),
    ("slot_mapping", torch.int64, lambda t, r, b: (t,)),
    ("logits_indices", torch.int64, lambda t, r, b: (t,)),
    ("query_start_loc", torch.int32, lambda t, r, b: (r + 1,)),
    ("seq_lens", torch.int32, lambda t, r, b: (r,)),
    ("block_table", torch.int32, lambda t, r, b: (r, b)),
    ("pending", torch.int64, lambda t, r, b: (2 * r,)),
)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _spans(num_tokens: int, num_reqs: int, max_blocks: int
           ) -> tuple[list[tuple[str, torch.dtype, tuple[int, ...], int]], int]:
    """Each region's (name, dtype, shape, byte offset), and the bytes the shape spans."""
    spans, offset = [], 0
    for name, dtype, shape_of in _LAYOUT:
        shape = shape_of(num_tokens, num_reqs, max_blocks)
        spans.append((name, dtype, shape, offset))
        offset = _aligned(offset + int(np.prod(shape)) * dtype.itemsize)
    return spans, offset


class StepStaging:
    def __init__(self, max_num_tokens: int, max_num_reqs: int, max_blocks_per_req: int,
                 device: torch.device) -> None:
        self.max_num_tokens = max_num_tokens
        self.max_num_reqs = max_num_reqs
        self.max_blocks_per_req = max_blocks_per_req
        self.device = device
        _, capacity = _spans(max_num_tokens, max_num_reqs, max_blocks_per_req)
        self.host = torch.zeros(capacity, dtype=torch.uint8, pin_memory=device.type == "cuda")
        self.gpu = torch.zeros(capacity, dtype=torch.uint8, device=device)
        self._host_np = self.host.numpy()
        self._views: dict[tuple[int, int], StepViews] = {}

    def views(self, num_tokens: int, num_reqs: int) -> StepViews:
        """The regions of a step padded to num_tokens tokens and num_reqs requests."""
        key = (num_tokens, num_reqs)
        views = self._views.get(key)
        if views is None:
            if not (0 <= num_tokens <= self.max_num_tokens
                    and 0 <= num_reqs <= self.max_num_reqs):
                raise ValueError(f"a step of {num_tokens} tokens and {num_reqs} requests is "
                                 f"past the buffers' {self.max_num_tokens} and "
                                 f"{self.max_num_reqs}")
            if len(self._views) >= _MAX_CACHED_SHAPES:
                self._views.clear()
            views = self._views[key] = self._build(num_tokens, num_reqs)
        return views

    def send(self, views: StepViews) -> None:
        """Copy the shape's bytes to the device (asynchronously from pinned memory on CUDA:
        the host must not refill them until the copy has run)."""
        n = views.nbytes
        self.gpu[:n].copy_(self.host[:n], non_blocking=True)

    def _build(self, num_tokens: int, num_reqs: int) -> StepViews:
        spans, nbytes = _spans(num_tokens, num_reqs, self.max_blocks_per_req)
        regions = {}
        for name, dtype, shape, offset in spans:
            size = int(np.prod(shape)) * dtype.itemsize
            cpu = self.host[offset:offset + size].view(dtype).view(shape)
            gpu = self.gpu[offset:offset + size].view(dtype).view(shape)
            regions[name] = Region(cpu.numpy(), cpu, gpu)
        return StepViews(num_tokens=num_tokens, num_reqs=num_reqs, nbytes=nbytes, **regions)
