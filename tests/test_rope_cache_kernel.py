"""The fused rotary + KV-cache-write kernel against the torch reference (TorchOps.rotary and
an index write), on the CPU through the Triton interpreter; and the attention backends that
use it against the unfused path.

Every cache slot and output element starts as NaN, so an element the kernel should have
written but did not, or a padding row it should have skipped but wrote, shows up.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests.kernel_device import kernel_device
from tests.paged_reference import make_paged_batch, reference_attention, rel_err, tolerance
from warmgate.server.kernels.rope_cache import _rope_cache_kernel, rope_and_cache
from warmgate.server.kernels.rotary import rotary_embedding
from warmgate.server.runner.attention.base import AttentionMetadata, AttentionSpec, RopeInput
from warmgate.server.runner.attention.triton_backend import TritonAttentionBackend
from warmgate.server.runner.ops import TorchOps, build_cos_sin_cache

NAN = float("nan")
DEVICE = kernel_device(_rope_cache_kernel)


def _qkv(gen: torch.Generator, num_tokens: int, num_heads: int, num_kv_heads: int,
         head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as strided views of one fused projection row, the way the model hands them."""
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim,
                      generator=gen).to(DEVICE, dtype)
    q_end, k_end = num_heads * head_dim, (num_heads + num_kv_heads) * head_dim
    return (qkv[:, :q_end].view(num_tokens, num_heads, head_dim),
            qkv[:, q_end:k_end].view(num_tokens, num_kv_heads, head_dim),
            qkv[:, k_end:].view(num_tokens, num_kv_heads, head_dim))


CASES = [
    # dtype, num_heads, num_kv_heads, head_dim, block_size, layout
    (torch.float32, 4, 4, 16, 4, "NHD"),
    (torch.bfloat16, 8, 2, 32, 16, "NHD"),
    (torch.bfloat16, 6, 2, 16, 4, "HND"),
    (torch.float16, 4, 1, 64, 8, "HND"),
    (torch.bfloat16, 3, 3, 16, 4, "NHD"),  # head counts that are not powers of two
]


@pytest.mark.parametrize(("dtype", "num_heads", "num_kv_heads", "head_dim", "block_size",
                          "layout"), CASES)
def test_rope_and_cache_matches_torch(dtype: torch.dtype, num_heads: int, num_kv_heads: int,
                                      head_dim: int, block_size: int, layout: str) -> None:
    gen = torch.Generator().manual_seed(num_heads * 100 + head_dim)
    num_tokens, num_slots, num_blocks = 9, 7, 6
    q, k, v = _qkv(gen, num_tokens, num_heads, num_kv_heads, head_dim, dtype)
    positions = torch.randint(0, 64, (num_tokens,), generator=gen).to(DEVICE)
    cos_sin = build_cos_sin_cache(64, head_dim, 10000.0, DEVICE)
    # Distinct slots past the null block; one token marked "nothing to cache", and the last
    # two tokens have no slot at all (graph padding beyond the slot mapping).
    slots = torch.randperm((num_blocks - 1) * block_size, generator=gen)[:num_slots] + block_size
    slots[2] = -1
    slots = slots.to(DEVICE)
    shape = ((num_blocks, block_size, num_kv_heads, head_dim) if layout == "NHD"
             else (num_blocks, num_kv_heads, block_size, head_dim))
    key_cache = torch.full(shape, NAN, dtype=dtype, device=DEVICE)
    value_cache = torch.full(shape, NAN, dtype=dtype, device=DEVICE)
    q_out = torch.full((num_tokens, num_heads, head_dim), NAN, dtype=dtype, device=DEVICE)

    got = rope_and_cache(q, k, v, positions, cos_sin, key_cache, value_cache, slots,
                         layout=layout, q_out=q_out)  # type: ignore[arg-type]

    # The unfused rotary kernel the runner ran before: the same arithmetic, so the same bits
    # (the interpreter rounds float32 to bf16 differently from torch, so TorchOps, the CPU
    # reference, is matched within the dtype's tolerance, and exactly in float32).
    ref_q, ref_k = rotary_embedding(q, k, positions, cos_sin)
    torch_q, torch_k = TorchOps().rotary(q, k, positions, cos_sin)
    assert rel_err(ref_q, torch_q) <= tolerance(dtype)
    assert rel_err(ref_k, torch_k) <= tolerance(dtype)
    if dtype == torch.float32:
        assert torch.equal(ref_q, torch_q) and torch.equal(ref_k, torch_k)
    assert got is q_out
    # Every token's q is rotated, padding rows included.
    assert torch.equal(got, ref_q)
    # [slots, Hk, D] whatever the layout, so a slot id indexes it.
    as_nhd = (lambda c: c) if layout == "NHD" else (lambda c: c.transpose(1, 2))
    flat_k = as_nhd(key_cache).reshape(-1, num_kv_heads, head_dim)
    flat_v = as_nhd(value_cache).reshape(-1, num_kv_heads, head_dim)
    written = slots >= 0
    token_idx = torch.arange(num_slots, device=DEVICE)[written]
    assert torch.equal(flat_k[slots[written]], ref_k[token_idx])
    assert torch.equal(flat_v[slots[written]], v[token_idx])
    # Nothing else was touched: the -1 token and the rows past the slot mapping wrote nothing.
    per_cache = int(written.sum()) * num_kv_heads * head_dim
    assert int((~key_cache.isnan()).sum()) == per_cache
    assert int((~value_cache.isnan()).sum()) == per_cache


def small_call() -> tuple[torch.Tensor, ...]:
    """Valid arguments of one small rope_and_cache call (3 tokens, 2 query heads, 1 KV head of
    16, one cache for both keys and values) for the tests that change one of them:
    q, k, v, positions, cos_sin, cache, slots."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = _qkv(gen, 3, 2, 1, 16, torch.float32)
    cache = torch.zeros(2, 4, 1, 16, device=DEVICE)
    cos_sin = build_cos_sin_cache(8, 16, 10000.0, DEVICE)
    slots = torch.zeros(3, dtype=torch.int64, device=DEVICE)
    positions = torch.zeros(3, dtype=torch.int64, device=DEVICE)
    return q, k, v, positions, cos_sin, cache, slots


def test_rope_and_cache_rejects_bad_shapes() -> None:
    q, k, v, positions, cos_sin, cache, slots = small_call()
    with pytest.raises(ValueError, match="layout"):
        rope_and_cache(q, k, v, positions, cos_sin, cache, cache, slots,
                       layout="NDH")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cos/sin"):
        rope_and_cache(q, k, v, positions, build_cos_sin_cache(8, 8, 1e4, DEVICE), cache,
                       cache, slots)
    with pytest.raises(ValueError, match="4 slots"):
        rope_and_cache(q, k, v, positions, cos_sin, cache, cache,
                       torch.zeros(4, dtype=torch.int64, device=DEVICE))


def _meta(batch: object, uniform: bool) -> AttentionMetadata:
    q_lens = batch.q_lens  # type: ignore[attr-defined]
    return AttentionMetadata(
        num_reqs=len(q_lens), num_tokens=sum(q_lens), max_query_len=max(q_lens),
        max_seq_len=int(batch.seq_lens.max()),  # type: ignore[attr-defined]
        query_start_loc=batch.query_start_loc,  # type: ignore[attr-defined]
        seq_lens=batch.seq_lens, block_table=batch.block_table,  # type: ignore[attr-defined]
        slot_mapping=batch.slot_mapping, positions=batch.positions,  # type: ignore[attr-defined]
        query_start_loc_cpu=batch.query_start_loc.cpu(),  # type: ignore[attr-defined]
        seq_lens_cpu=batch.seq_lens.cpu(), is_uniform_decode=uniform,  # type: ignore[attr-defined]
    )


@pytest.mark.parametrize(("q_lens", "context_lens", "uniform", "head_dim"), [
    ([1, 1, 1], [5, 17, 0], True, 16),  # decode: the decode kernel rotates and caches itself
    ([1, 1, 1], [5, 17, 0], True, 24),  # a head_dim it cannot join: rope_and_cache first
    ([2, 5], [9, 0], False, 16),  # mixed: decode-ish + fresh prefill
])
def test_triton_backend_fused_rope_equals_rotate_then_attend(
        q_lens: list[int], context_lens: list[int], uniform: bool, head_dim: int) -> None:
    """forward(q, k, v, rope) gives exactly what rotating first and caching after gives, and
    leaves the same cache."""
    num_heads, num_kv_heads, block_size = 8, 2, 4
    batch = make_paged_batch(50, q_lens, context_lens, num_heads, num_kv_heads, head_dim,
                             block_size, torch.bfloat16, DEVICE)
    spec = AttentionSpec(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                         block_size=block_size, num_blocks=batch.kv_cache.shape[1],
                         max_blocks_per_req=batch.block_table.shape[1], max_num_reqs=4,
                         max_num_tokens=32, dtype=torch.bfloat16, device=torch.device(DEVICE))
    backend = TritonAttentionBackend(spec)
    assert backend.fuses_rope
    cos_sin = build_cos_sin_cache(64, head_dim, 10000.0, DEVICE)
    meta = _meta(batch, uniform)
    # What the runner did before: the rotary kernel, then the cache write inside forward.
    rot_q, rot_k = rotary_embedding(batch.q, batch.k_new, batch.positions, cos_sin)
    unfused_cache = batch.kv_cache.clone()
    unfused = backend.forward(0, rot_q, rot_k, batch.v_new, unfused_cache, meta)
    fused = backend.forward(0, batch.q, batch.k_new, batch.v_new, batch.kv_cache, meta,
                            RopeInput(batch.positions, cos_sin))
    assert torch.equal(fused, unfused)
    assert torch.equal(batch.kv_cache.nan_to_num(), unfused_cache.nan_to_num())
    # And the attention itself is right: the reference with rotated queries and new keys.
    for i, keys in enumerate(batch.keys):
        start = int(batch.query_start_loc[i])
        keys[context_lens[i]:] = rot_k[start:start + q_lens[i]].float()
    batch.q = rot_q
    assert rel_err(fused, reference_attention(batch, spec.scale)) <= 1e-2
