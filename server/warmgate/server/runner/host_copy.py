"""Small host-side lists (indices, per-row parameters) onto the device without a stream wait."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(values: Sequence[int] | Sequence[float] | Sequence[bool], dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    """`torch.tensor(values, device=cuda)` copies from pageable memory and then waits for
    the whole stream (every kernel queued before it) to drain: a sampler building five index
    tensors that way stalls the host five times a step, each time until the GPU is idle.
    Staging in pinned memory lets the copy queue behind those kernels instead; the caching
    host allocator keeps the pinned block until the copy has run."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
