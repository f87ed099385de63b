"""Qwen3's per-head q/k RMSNorm inside the fused rotary + KV-cache-write kernel, on the CPU
through the Triton interpreter: against torch (the norm in float32, rounded to the activation
dtype, then TorchOps.rotary and an index write) and against the separate kernels it replaces
(kernels.rms_norm per head, then the rotary kernel), which it must match up to the order of
the norm's sum of squares; and a token's outputs alone and inside a batch.

Every cache slot and output element starts as NaN, so an element the kernel should have
written but did not, or a padding row it should have skipped but wrote, shows up.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests.paged_reference import rel_err, tolerance
from tests.test_rope_cache_kernel import DEVICE, _qkv, small_call
from warmgate.server.kernels.rms_norm import rms_norm
from warmgate.server.kernels.rope_cache import rope_and_cache
from warmgate.server.kernels.rotary import rotary_embedding
from warmgate.server.runner.ops import TorchOps, build_cos_sin_cache

NAN = float("nan")
EPS = 1e-6
MAX_POS = 64

CASES = [
    # dtype, num_heads, num_kv_heads, head_dim, block_size, layout
    (torch.float32, 4, 4, 16, 4, "NHD"),
    (torch.bfloat16, 8, 2, 32, 16, "NHD"),
    (torch.bfloat16, 6, 2, 16, 4, "HND"),
    (torch.float32, 3, 1, 64, 8, "HND"),  # head counts that are not powers of two
    (torch.bfloat16, 4, 1, 128, 8, "NHD"),  # Qwen3's head_dim
]


def _norm_weight(gen: torch.Generator, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """[D] around 1, like a trained RMSNorm gain, and far enough from it to matter."""
    return (torch.rand(head_dim, generator=gen) + 0.5).to(DEVICE, dtype)


def _torch_head_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D] -> every head RMS-normalised over D in float32 and rounded to x's dtype."""
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + EPS)
    return (xf * rstd * weight.float()).to(x.dtype)


def _separate_kernels(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                      cos_sin: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """What a Qwen3 layer launched before on CUDA: two per-head norms, then the rotation."""
    head_dim = q.shape[-1]
    q_normed, _ = rms_norm(q.reshape(-1, head_dim), q_weight, EPS)
    k_normed, _ = rms_norm(k.reshape(-1, head_dim), k_weight, EPS)
    return rotary_embedding(q_normed.view(q.shape), k_normed.view(k.shape), positions, cos_sin)


def _assert_same_up_to_sum_order(got: torch.Tensor, ref: torch.Tensor) -> None:
    """The fused norm adds the two halves' sums of squares where the separate kernel sums the
    row at once: float32 may move by an ulp or two of the normalised values (about 1 in
    magnitude; a rotated element near 0 keeps that absolute error); after rounding to bf16
    that almost never shows, while rotating unrounded values would change most elements."""
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=4e-6)
        return
    torch.testing.assert_close(got, ref, rtol=2 ** -7, atol=2 ** -6)
    assert float((got != ref).float().mean()) <= 0.01


def _caches(layout: str, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
            dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    shape = ((num_blocks, block_size, num_kv_heads, head_dim) if layout == "NHD"
             else (num_blocks, num_kv_heads, block_size, head_dim))
    return (torch.full(shape, NAN, dtype=dtype, device=DEVICE),
            torch.full(shape, NAN, dtype=dtype, device=DEVICE))


def _as_slots(cache: torch.Tensor, layout: str) -> torch.Tensor:
    """[slots, Hk, D] whatever the layout, so a slot id indexes it."""
    nhd = cache if layout == "NHD" else cache.transpose(1, 2)
    return nhd.reshape(-1, *nhd.shape[2:])


@pytest.mark.parametrize(("dtype", "num_heads", "num_kv_heads", "head_dim", "block_size",
                          "layout"), CASES)
def test_normed_rope_and_cache_matches_torch_and_the_separate_kernels(
        dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int,
        block_size: int, layout: str) -> None:
    gen = torch.Generator().manual_seed(num_heads * 100 + head_dim)
    num_tokens, num_slots, num_blocks = 9, 7, 6
    q, k, v = _qkv(gen, num_tokens, num_heads, num_kv_heads, head_dim, dtype)
    # In place, so q and k stay strided views of the fused projection: an RMS far from 1 on
    # each side, so a missing norm shows.
    q.mul_(3.0)
    k.mul_(0.25)
    assert q.stride(0) == k.stride(0) == (num_heads + 2 * num_kv_heads) * head_dim
    q_weight, k_weight = _norm_weight(gen, head_dim, dtype), _norm_weight(gen, head_dim, dtype)
    positions = torch.randint(0, MAX_POS, (num_tokens,), generator=gen).to(DEVICE)
    cos_sin = build_cos_sin_cache(MAX_POS, head_dim, 10000.0, DEVICE)
    # Distinct slots past the null block; one token marked "nothing to cache", and the last
    # two tokens have no slot at all (graph padding beyond the slot mapping).
    slots = torch.randperm((num_blocks - 1) * block_size, generator=gen)[:num_slots] + block_size
    slots[2] = -1
    slots = slots.to(DEVICE)
    key_cache, value_cache = _caches(layout, num_blocks, block_size, num_kv_heads, head_dim,
                                     dtype)
    q_out = torch.full((num_tokens, num_heads, head_dim), NAN, dtype=dtype, device=DEVICE)

    got = rope_and_cache(q, k, v, positions, cos_sin, key_cache, value_cache, slots,
                         layout=layout, q_out=q_out,  # type: ignore[arg-type]
                         q_norm_weight=q_weight, k_norm_weight=k_weight, eps=EPS)

    torch_q, torch_k = TorchOps().rotary(_torch_head_norm(q, q_weight),
                                         _torch_head_norm(k, k_weight), positions, cos_sin)
    sep_q, sep_k = _separate_kernels(q, k, positions, cos_sin, q_weight, k_weight)
    assert got is q_out
    # Every token's q is normalised and rotated, padding rows included. Torch within the
    # dtype's tolerance (the interpreter rounds float32 to bf16 its own way), the separate
    # kernels, which round in the same interpreter, up to the sum of squares' order.
    assert rel_err(got, torch_q) <= tolerance(dtype)
    _assert_same_up_to_sum_order(got, sep_q)
    written = slots >= 0
    token_idx = torch.arange(num_slots, device=DEVICE)[written]
    cached_k = _as_slots(key_cache, layout)[slots[written]]
    assert rel_err(cached_k, torch_k[token_idx]) <= tolerance(dtype)
    _assert_same_up_to_sum_order(cached_k, sep_k[token_idx])
    assert torch.equal(_as_slots(value_cache, layout)[slots[written]], v[token_idx])
    # Nothing else was touched: the -1 token and the rows past the slot mapping wrote nothing.
    per_cache = int(written.sum()) * num_kv_heads * head_dim
    assert int((~key_cache.isnan()).sum()) == per_cache
    assert int((~value_cache.isnan()).sum()) == per_cache


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_tokens_outputs_are_the_same_bits_alone_and_in_a_batch(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(11)
    num_tokens, num_heads, num_kv_heads, head_dim, block_size, num_blocks = 7, 6, 2, 32, 4, 4
    q, k, v = _qkv(gen, num_tokens, num_heads, num_kv_heads, head_dim, dtype)
    q_weight, k_weight = _norm_weight(gen, head_dim, dtype), _norm_weight(gen, head_dim, dtype)
    positions = torch.randint(0, MAX_POS, (num_tokens,), generator=gen).to(DEVICE)
    cos_sin = build_cos_sin_cache(MAX_POS, head_dim, 10000.0, DEVICE)
    slots = (torch.randperm((num_blocks - 1) * block_size, generator=gen)[:num_tokens]
             + block_size).to(DEVICE)
    norm = dict(q_norm_weight=q_weight, k_norm_weight=k_weight, eps=EPS)
    batch_k, batch_v = _caches("NHD", num_blocks, block_size, num_kv_heads, head_dim, dtype)
    batch_q = rope_and_cache(q, k, v, positions, cos_sin, batch_k, batch_v, slots,
                             **norm)  # type: ignore[arg-type]
    for i in range(num_tokens):
        one = slice(i, i + 1)
        alone_k, alone_v = _caches("NHD", num_blocks, block_size, num_kv_heads, head_dim, dtype)
        alone_q = rope_and_cache(q[one], k[one], v[one], positions[one], cos_sin, alone_k,
                                 alone_v, slots[one], **norm)  # type: ignore[arg-type]
        assert torch.equal(alone_q[0], batch_q[i])
        slot = int(slots[i])
        assert torch.equal(_as_slots(alone_k, "NHD")[slot], _as_slots(batch_k, "NHD")[slot])
        assert torch.equal(_as_slots(alone_v, "NHD")[slot], _as_slots(batch_v, "NHD")[slot])


def test_the_norm_arguments_come_together_and_match_head_dim() -> None:
    q, k, v, positions, cos_sin, cache, slots = small_call()
    weight = torch.ones(16, device=DEVICE)
    with pytest.raises(ValueError, match="come together"):
        rope_and_cache(q, k, v, positions, cos_sin, cache, cache, slots, q_norm_weight=weight,
                       eps=EPS)
    with pytest.raises(ValueError, match="come together"):
        rope_and_cache(q, k, v, positions, cos_sin, cache, cache, slots, q_norm_weight=weight,
                       k_norm_weight=weight)
    with pytest.raises(ValueError, match=r"k_norm_weight must be a dense \[16\]"):
        rope_and_cache(q, k, v, positions, cos_sin, cache, cache, slots, q_norm_weight=weight,
                       k_norm_weight=torch.ones(8, device=DEVICE), eps=EPS)
