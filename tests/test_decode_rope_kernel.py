"""The decode kernel that rotates q and k and writes the cache itself (paged_attention_decode
with a DecodeRope), on the CPU through the Triton interpreter, against the two launches it
replaces: kernels.rope_cache.rope_and_cache, then the decode kernel on the rotated q.

make_paged_batch leaves every cache slot nobody wrote NaN, this step's slots included: a
kernel that read one of this step's slots before writing it, or left one unwritten, gives NaN
(in the interpreter the programs run one after another, so tests/gpu/test_decode_rope_gpu.py
checks the order inside a program on the GPU).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests.kernel_device import kernel_device
from tests.paged_reference import PagedBatch, make_paged_batch
from warmgate.server.kernels._decode_rope import DecodeRope
from warmgate.server.kernels.decode_attention import (
    _decode_kernel,
    merge_counts_for,
    paged_attention_decode,
)
from warmgate.server.kernels.rope_cache import rope_and_cache
from warmgate.server.runner.ops import build_cos_sin_cache

DEVICE = kernel_device(_decode_kernel)
EPS = 1e-6
CONTEXTS = [0, 5, 16, 70]  # none cached, mid-page, a page, across several 16-key tiles

CASES = [
    # dtype, num_heads, num_kv_heads, head_dim, block_size, q_len, num_splits, qk_norm
    (torch.float32, 4, 4, 16, 4, 1, 1, False),
    (torch.bfloat16, 8, 2, 32, 16, 1, 4, True),
    (torch.float32, 4, 2, 16, 8, 4, 2, False),  # drafts that straddle two splits' ranges
    (torch.bfloat16, 4, 1, 128, 8, 3, 8, True),  # Qwen3's head_dim; empty trailing splits
]


def _strided(batch: PagedBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as views of one fused projection row, the way the model hands them."""
    parts = (batch.q, batch.k_new, batch.v_new)
    qkv = torch.cat([p.flatten(1) for p in parts], dim=1)
    views, start = [], 0
    for p in parts:
        width = p.shape[1] * p.shape[2]
        views.append(qkv[:, start:start + width].view(p.shape))
        start += width
    return views[0], views[1], views[2]


def _norms(head_dim: int, dtype: torch.dtype, on: bool, device: torch.device
           ) -> tuple[torch.Tensor | None, torch.Tensor | None, float | None]:
    if not on:
        return None, None, None
    gen = torch.Generator().manual_seed(head_dim)
    return ((torch.rand(head_dim, generator=gen) + 0.5).to(device, dtype),
            (torch.rand(head_dim, generator=gen) + 0.5).to(device, dtype), EPS)


def both_paths(batch: PagedBatch, q_len: int, num_splits: int, qk_norm: bool,
               slot_mapping: torch.Tensor | None = None, max_pos: int = 256
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fused output, its cache, the two launches' output, their cache) from the same batch,
    on the batch's device."""
    q, k, v = _strided(batch)
    head_dim, device = q.shape[2], q.device
    cos_sin = build_cos_sin_cache(max_pos, head_dim, 10000.0, device)
    qw, kw, eps = _norms(head_dim, q.dtype, qk_norm, device)
    slots = batch.slot_mapping if slot_mapping is None else slot_mapping
    args = (batch.block_table, batch.seq_lens, batch.query_start_loc)
    counts = merge_counts_for(batch.num_reqs, k.shape[1], device)
    kw_decode = dict(scale=head_dim ** -0.5, query_len=q_len, num_splits=num_splits,
                     merge_counts=counts if num_splits > 1 else None)
    apart_cache = batch.kv_cache.clone()
    rotated = rope_and_cache(q, k, v, batch.positions, cos_sin, apart_cache[0], apart_cache[1],
                             slots, q_norm_weight=qw, k_norm_weight=kw, eps=eps)
    apart = paged_attention_decode(rotated, apart_cache, *args, **kw_decode)
    fused_cache = batch.kv_cache.clone()
    fused = paged_attention_decode(
        q, fused_cache, *args, **kw_decode,
        rope=DecodeRope(k, v, batch.positions, cos_sin, slots, qw, kw, eps))
    assert not counts.any()  # left zero for the next launch (a graph replay)
    return fused, fused_cache, apart, apart_cache


@pytest.mark.parametrize(("dtype", "num_heads", "num_kv_heads", "head_dim", "block_size",
                          "q_len", "num_splits", "qk_norm"), CASES)
def test_the_fused_decode_matches_rope_and_cache_then_decode(
        dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
        q_len: int, num_splits: int, qk_norm: bool) -> None:
    batch = make_paged_batch(30 + num_splits, [q_len] * len(CONTEXTS), CONTEXTS, num_heads,
                             num_kv_heads, head_dim, block_size, dtype, DEVICE)
    fused, fused_cache, apart, apart_cache = both_paths(batch, q_len, num_splits, qk_norm)
    # The same arithmetic in the same order as the two launches: the same bits, in the
    # output and in every cache slot (the ones this step writes, and NaN in the rest).
    assert torch.isfinite(fused).all()
    assert torch.equal(fused, apart)
    assert torch.isfinite(fused_cache.flatten(1, 2)[:, batch.slot_mapping]).all()
    assert torch.equal(fused_cache.nan_to_num(nan=7.0), apart_cache.nan_to_num(nan=7.0))
    assert torch.equal(torch.isnan(fused_cache), torch.isnan(apart_cache))


def test_a_token_without_a_slot_writes_nothing() -> None:
    """A negative slot (nothing to cache) and a token past the slot mapping write nothing,
    as rope_and_cache writes nothing for them: both paths then read the same NaN there, and
    every other slot and output is the same bits."""
    batch = make_paged_batch(41, [1] * 4, CONTEXTS, 4, 2, 16, 4, torch.float32, DEVICE)
    slots = batch.slot_mapping.clone()
    skipped = int(slots[1])
    slots[1] = -1
    fused, fused_cache, apart, apart_cache = both_paths(batch, 1, 2, False, slot_mapping=slots[:3])
    flat = fused_cache.flatten(1, 2)  # [2, slots, Hk, D]
    assert torch.isnan(flat[:, skipped]).all()
    assert torch.isnan(flat[:, int(batch.slot_mapping[3])]).all()
    assert torch.isfinite(flat[:, slots[[0, 2]]]).all()
    assert torch.isfinite(fused[[0, 2]]).all()
    assert torch.equal(fused.nan_to_num(nan=7.0), apart.nan_to_num(nan=7.0))
    assert torch.equal(fused_cache.nan_to_num(nan=7.0), apart_cache.nan_to_num(nan=7.0))


def test_refuses_a_rope_it_cannot_apply() -> None:
    batch = make_paged_batch(42, [1, 1], [3, 4], 4, 2, 16, 4, torch.float32, DEVICE)
    q, k, v = _strided(batch)
    args = (q, batch.kv_cache, batch.block_table, batch.seq_lens, batch.query_start_loc)
    cos_sin = build_cos_sin_cache(64, 16, 10000.0, DEVICE)
    with pytest.raises(ValueError, match="come together"):
        paged_attention_decode(*args, scale=0.25, query_len=1, rope=DecodeRope(
            k, v, batch.positions, cos_sin, batch.slot_mapping, q_norm_weight=k[0, 0]))
    with pytest.raises(ValueError, match="cos/sin cache width"):
        paged_attention_decode(*args, scale=0.25, query_len=1, rope=DecodeRope(
            k, v, batch.positions, cos_sin[:, :8], batch.slot_mapping))
    with pytest.raises(ValueError, match="positions"):
        paged_attention_decode(*args, scale=0.25, query_len=1, rope=DecodeRope(
            k, v, batch.positions[:1], cos_sin, batch.slot_mapping))
    odd = make_paged_batch(43, [1], [3], 2, 1, 24, 4, torch.float32, DEVICE)  # head_dim 24
    q, k, v = _strided(odd)
    with pytest.raises(ValueError, match="not a power of two"):
        paged_attention_decode(q, odd.kv_cache, odd.block_table, odd.seq_lens,
                               odd.query_start_loc, scale=0.25, query_len=1,
                               rope=DecodeRope(k, v, odd.positions,
                                               build_cos_sin_cache(64, 24, 1e4, DEVICE),
                                               odd.slot_mapping))
