"""Launch-time helpers shared by the kernel wrappers (host side only, no device syncs)."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class PagedAttentionLaunch:
    """What both paged-attention wrappers derive from their arguments before launching."""

    q: torch.Tensor  # [T, Hq, D], unit stride in the last dimension
    out: torch.Tensor  # [T, Hq, D]
    key_cache: torch.Tensor  # [num_blocks, block_size, Hk, D]
    value_cache: torch.Tensor  # [num_blocks, block_size, Hk, D]
    num_reqs: int
    block_size: int
    num_kv_heads: int
    group: int  # query heads per KV head


def prepare_paged_attention(q: torch.Tensor, kv_cache: torch.Tensor, seq_lens: torch.Tensor,
                            num_reqs: int | None, out: torch.Tensor | None
                            ) -> PagedAttentionLaunch:
    """Check the GQA shapes, default num_reqs to len(seq_lens), allocate out if not given."""
    num_heads = q.shape[1]
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    q = unit_stride_last(q)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    return PagedAttentionLaunch(
        q=q, out=out, key_cache=kv_cache[0], value_cache=kv_cache[1],
        num_reqs=seq_lens.shape[0] if num_reqs is None else num_reqs, block_size=block_size,
        num_kv_heads=num_kv_heads, group=num_heads // num_kv_heads)
