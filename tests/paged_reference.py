"""Paged-attention test batches and a naive float32 reference, shared by the CPU (interpreter)
and GPU kernel tests.

A batch is built the way the runner leaves it before attention: each request's cached prefix
is already in the paged cache, this step's new keys/values are separate tensors with their
slot_mapping (the kernels under test write them), and every cache slot nobody wrote is NaN so
a kernel that reads an unwritten or null slot without masking it shows up as NaN.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

NAN = float("nan")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class PagedBatch:
    q: torch.Tensor  # [T, Hq, D]
    k_new: torch.Tensor  # [T, Hk, D]
    v_new: torch.Tensor  # [T, Hk, D]
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, Hk, D], prefixes written, rest NaN
    block_table: torch.Tensor  # [R, max_blocks_per_req] int32, 0-padded
    seq_lens: torch.Tensor  # [R] int32
    query_start_loc: torch.Tensor  # [R + 1] int32
    slot_mapping: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    keys: list[torch.Tensor]  # per request [seq_len, Hk, D] float32 (dtype-rounded)
    values: list[torch.Tensor]  # per request [seq_len, Hk, D] float32
    q_lens: list[int]

    @property
    def num_reqs(self) -> int:
        return len(self.q_lens)


def make_paged_batch(seed: int, q_lens: Sequence[int], context_lens: Sequence[int],
                     num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                     dtype: torch.dtype, device: str | torch.device = "cpu",
                     extra_table_cols: int = 2) -> PagedBatch:
    """Requests with q_lens[i] new tokens after context_lens[i] cached ones; pages shuffled."""
    gen = torch.Generator(device=device).manual_seed(seed)
    seq_lens = [c + q for c, q in zip(context_lens, q_lens, strict=True)]
    blocks_per_req = [cdiv(s, block_size) for s in seq_lens]
    num_blocks = 1 + sum(blocks_per_req) + 3  # null block 0 and a few never used
    # Shuffled pages: a kernel that assumes a request's blocks are contiguous fails.
    pages = (torch.randperm(num_blocks - 1, generator=gen, device=device) + 1).tolist()
    table = torch.zeros(len(q_lens), max(blocks_per_req, default=0) + extra_table_cols,
                        dtype=torch.int32)
    kv_cache = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), NAN, dtype=dtype,
                          device=device)
    flat_k = kv_cache[0].view(-1, num_kv_heads, head_dim)  # [slots, Hk, D]
    flat_v = kv_cache[1].view(-1, num_kv_heads, head_dim)
    keys, values, k_new, v_new, slots_new, positions = [], [], [], [], [], []
    used = 0
    for i, (ctx, seq_len) in enumerate(zip(context_lens, seq_lens, strict=True)):
        req_pages = torch.tensor(pages[used:used + blocks_per_req[i]], dtype=torch.int64)
        used += blocks_per_req[i]
        table[i, :len(req_pages)] = req_pages.to(torch.int32)
        pos = torch.arange(seq_len)
        slots = (req_pages[pos // block_size] * block_size + pos % block_size).to(device)
        k = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen, device=device).to(dtype)
        v = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen, device=device).to(dtype)
        flat_k[slots[:ctx]] = k[:ctx]
        flat_v[slots[:ctx]] = v[:ctx]
        keys.append(k.float())
        values.append(v.float())
        k_new.append(k[ctx:])
        v_new.append(v[ctx:])
        slots_new.append(slots[ctx:])
        positions.append(pos[ctx:].to(device))
    num_tokens = sum(q_lens)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=gen, device=device).to(dtype)
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(list(q_lens), dtype=torch.int32).cumsum(0)
    return PagedBatch(
        q=q, k_new=torch.cat(k_new), v_new=torch.cat(v_new), kv_cache=kv_cache,
        block_table=table.to(device), seq_lens=torch.tensor(seq_lens, dtype=torch.int32,
                                                            device=device),
        query_start_loc=qsl.to(device), slot_mapping=torch.cat(slots_new),
        positions=torch.cat(positions), keys=keys, values=values, q_lens=list(q_lens))


def reference_attention(batch: PagedBatch, scale: float) -> torch.Tensor:
    """Naive dense causal attention per request in float32 -> [T, Hq, D] float32."""
    num_heads = batch.q.shape[1]
    out = torch.zeros(batch.q.shape, dtype=torch.float32, device=batch.q.device)
    start = 0
    for q_len, k, v in zip(batch.q_lens, batch.keys, batch.values, strict=True):
        if q_len == 0:
            continue
        seq_len = k.shape[0]
        group = num_heads // k.shape[1]
        k = k.repeat_interleave(group, dim=1)  # [L, Hq, D]: query head h reads KV head h // g
        v = v.repeat_interleave(group, dim=1)
        q = batch.q[start:start + q_len].float()  # [n, Hq, D]
        scores = torch.einsum("nhd,lhd->hnl", q, k) * scale  # [Hq, n, L]
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)  # [n]
        k_pos = torch.arange(seq_len, device=q.device)  # [L]
        scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        out[start:start + q_len] = torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v)
        start += q_len
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float32; NaN anywhere in out makes it NaN (never passes)."""
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def tolerance(dtype: torch.dtype) -> float:
    return 1e-4 if dtype == torch.float32 else 1e-2


def within_ulps(out: torch.Tensor, ref: torch.Tensor, ulps: int) -> bool:
    """Each bf16 element of out within `ulps` units in the last place of the larger of the two."""
    larger = torch.maximum(out.float().abs(), ref.float().abs()).clamp(min=2.0 ** -126)
    ulp = torch.exp2(torch.floor(torch.log2(larger)) - 7)
    return bool(((out.float() - ref.float()).abs() <= ulps * ulp).all())


def assert_fused_decode_close(out: torch.Tensor, ref: torch.Tensor, cache: torch.Tensor,
                              ref_cache: torch.Tensor, context: object = None) -> None:
    """The decode kernel that rotates q and k and writes the cache itself, against the
    rope-and-cache launch then the decode kernel: compiled apart, the two may contract the
    rotation's multiply and add differently (tests/gpu/test_decode_rope_gpu.py says how far
    apart an H100 put them). Each cache element within one bf16 ulp, NaN where the other is
    (a slot nobody writes); the output, whose elements sum many products, within a relative
    error of 1e-3 and at most 1% of its elements differing. A cache slot read before it was
    written is off by far more."""
    assert torch.isfinite(out).all(), context
    assert torch.equal(torch.isnan(cache), torch.isnan(ref_cache)), context
    assert within_ulps(cache.nan_to_num(nan=7.0), ref_cache.nan_to_num(nan=7.0), 1), context
    assert rel_err(out, ref) <= 1e-3, context
    differing = (out != ref).float().mean().item()
    assert differing <= 1e-2, (context, differing)
