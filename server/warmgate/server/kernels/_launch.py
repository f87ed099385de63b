"""Launch-time helpers shared by the kernel wrappers (host side only, no device syncs)."""

from __future__ import annotations

import torch
import triton


def pow2(n: int, minimum: int = 1) -> int:
    """The next power of two >= max(n, minimum): Triton tiles have power-of-two extents."""
    return max(triton.next_power_of_2(n), minimum)


def upcast_dots(t: torch.Tensor) -> bool:
    """Whether tl.dot operands must be upcast to float32 before the product.

    CPU tensors mean the Triton interpreter, whose tl.dot multiplies bfloat16 operands as raw
    16-bit integers (triton 3.9); on the GPU the tensor cores take bf16/fp16 directly.
    """
    return not t.is_cuda


def ieee_dots(dtype: torch.dtype) -> bool:
    """float32 inputs need IEEE products: the default TF32 would cost ~1e-3 relative error."""
    return dtype == torch.float32


def unit_stride_last(t: torch.Tensor) -> torch.Tensor:
    """The kernels index the last dimension with unit stride; anything else gets a copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def elementwise_warps(block: int) -> int:
    """Warps for a one-row-per-program kernel: ~256 elements a warp, 1 to 8 warps."""
    return min(max(block // 256, 1), 8)
