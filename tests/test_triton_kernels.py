"""The Triton kernels against float32 torch references, on the CPU through the interpreter.

Shapes are tiny (the interpreter runs each program in Python) but chosen to cross every
boundary the kernels handle: contexts that end mid-page and mid-tile, several KV tiles and
splits, GQA ratios 1 and 4, speculative decode lengths 1 and 4, and mixed batches whose
prefixes are already cached. Every kernel output starts as NaN so unwritten elements fail.

On a machine with CUDA the interpreter is not forced, and the same checks run the compiled
kernels on the GPU (tests/gpu/ has the real-shape versions).
"""

from __future__ import annotations

import inspect

import pytest
import torch

pytest.importorskip("triton")

from tests.kernel_device import kernel_device
from tests.paged_reference import (
    make_paged_batch,
    reference_attention,
    rel_err,
    tolerance,
)
from warmgate.server.kernels import (
    _decode_merge,
    choose_num_splits,
    paged_attention_decode,
    paged_attention_varlen,
    reshape_and_cache,
)
from warmgate.server.kernels.decode_attention import MAX_SPLITS, _decode_kernel, merge_counts_for
from warmgate.server.kernels.ops import TritonOps
from warmgate.server.runner.attention.base import (
    AttentionMetadata,
    AttentionSpec,
)
from warmgate.server.runner.attention.triton_backend import TritonAttentionBackend
from warmgate.server.runner.ops import TorchOps, build_cos_sin_cache

NAN = float("nan")
# Interpreted kernels read CPU tensors, compiled ones CUDA tensors.
DEVICE = kernel_device(_decode_kernel)


@pytest.fixture(autouse=True)
def poisoned_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every float tensor the wrappers allocate starts as NaN, so a kernel that leaves an
    element of its output (or of a split-K partial) unwritten fails the comparison."""
    real_empty = torch.empty

    def empty(*args: object, **kwargs: object) -> torch.Tensor:
        t = real_empty(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(NAN)
        return t

    monkeypatch.setattr(torch, "empty", empty)


def _nan_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, NAN)


# ---------------------------------------------------------------- element-wise ops

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype: torch.dtype, with_residual: bool) -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 48, generator=gen).to(DEVICE, dtype)  # [T, H], H not a power of two
    weight = (1 + 0.1 * torch.randn(48, generator=gen)).to(DEVICE, dtype)
    residual = torch.randn(5, 48, generator=gen).to(DEVICE, dtype) if with_residual else None
    out, new_residual = TritonOps().rms_norm(x, weight, 1e-6, residual)
    s = x.float() if residual is None else (x.float() + residual.float()).to(dtype).float()
    ref = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()
    assert out.dtype == dtype and out.shape == x.shape
    assert rel_err(out, ref) <= tolerance(dtype)
    assert rel_err(new_residual, s) <= tolerance(dtype)
    torch_out, torch_res = TorchOps().rms_norm(x, weight, 1e-6, residual)
    assert rel_err(out, torch_out) <= tolerance(dtype)
    assert rel_err(new_residual, torch_res) <= tolerance(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 2 * 40, generator=gen).to(DEVICE, dtype)  # [T, 2I]
    out = TritonOps().silu_and_mul(x)
    gate, up = x[:, :40].float(), x[:, 40:].float()
    ref = gate * torch.sigmoid(gate) * up
    assert out.shape == (5, 40) and out.dtype == dtype
    assert rel_err(out, ref) <= tolerance(dtype)
    assert rel_err(out, TorchOps().silu_and_mul(x)) <= tolerance(dtype)


def _rotate_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@pytest.mark.parametrize(("dtype", "num_heads", "num_kv_heads", "head_dim"), [
    (torch.float32, 4, 4, 16),
    (torch.bfloat16, 4, 1, 32),
    (torch.float16, 6, 2, 16),
])
def test_rotary(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    gen = torch.Generator().manual_seed(3)
    cache = build_cos_sin_cache(64, head_dim, 10000.0, DEVICE)  # [max_pos, D]
    positions = torch.randint(0, 64, (7,), generator=gen, dtype=torch.int64).to(DEVICE)
    # q as a view of a fused qkv row, the way the model hands it over.
    qkv = torch.randn(7, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen).to(DEVICE, dtype)
    q = qkv[:, :num_heads * head_dim].view(7, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim:(num_heads + num_kv_heads) * head_dim].view(
        7, num_kv_heads, head_dim)
    q_out, k_out = TritonOps().rotary(q, k, positions, cache)
    cos = cache[positions, None, :head_dim // 2]
    sin = cache[positions, None, head_dim // 2:]
    assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.dtype == dtype
    assert rel_err(q_out, _rotate_ref(q, cos, sin)) <= tolerance(dtype)
    assert rel_err(k_out, _rotate_ref(k, cos, sin)) <= tolerance(dtype)
    torch_q, torch_k = TorchOps().rotary(q, k, positions, cache)
    assert rel_err(q_out, torch_q) <= tolerance(dtype)
    assert rel_err(k_out, torch_k) <= tolerance(dtype)


# ---------------------------------------------------------------- KV cache write

@pytest.mark.parametrize(("dtype", "block_size"), [(torch.float32, 4), (torch.bfloat16, 16)])
def test_reshape_and_cache(dtype: torch.dtype, block_size: int) -> None:
    gen = torch.Generator().manual_seed(4)
    num_blocks, num_kv_heads, head_dim = 6, 2, 16
    kv_cache = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), NAN, dtype=dtype,
                          device=DEVICE)
    num_tokens = 9
    slots = torch.randperm((num_blocks - 1) * block_size, generator=gen)[:num_tokens] + block_size
    slots[3] = -1  # a token with nothing to cache
    slots = slots.to(DEVICE)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
    reshape_and_cache(k, v, kv_cache, slots)
    flat = kv_cache.view(2, -1, num_kv_heads, head_dim)  # [2, slots, Hk, D]
    keep = slots >= 0
    assert torch.equal(flat[0, slots[keep]], k[keep])
    assert torch.equal(flat[1, slots[keep]], v[keep])
    # Nothing else was touched: the skipped token and every other slot are still NaN.
    assert int((~flat.isnan()).sum()) == 2 * int(keep.sum()) * num_kv_heads * head_dim


# ---------------------------------------------------------------- attention

DECODE_CASES = [
    # dtype, num_heads, num_kv_heads, head_dim, block_size, num_spec_steps, num_splits
    (torch.float32, 2, 2, 16, 4, 0, 1),
    (torch.float32, 8, 2, 16, 16, 3, 3),
    (torch.bfloat16, 8, 2, 32, 16, 3, 2),
    (torch.bfloat16, 2, 2, 32, 4, 3, 4),
    (torch.float16, 8, 2, 16, 4, 0, 1),
    # The most splits the planner picks: most are past every short sequence's end.
    (torch.bfloat16, 8, 2, 16, 4, 0, MAX_SPLITS),
    # 32 query rows of head dim 128 (a GQA group of 8 with three drafts).
    (torch.bfloat16, 8, 1, 128, 16, 3, 4),
]


@pytest.mark.parametrize(("dtype", "num_heads", "num_kv_heads", "head_dim", "block_size",
                          "num_spec_steps", "num_splits"), DECODE_CASES)
def test_paged_attention_decode(dtype: torch.dtype, num_heads: int, num_kv_heads: int,
                                head_dim: int, block_size: int, num_spec_steps: int,
                                num_splits: int) -> None:
    q_len = 1 + num_spec_steps
    # Contexts: none cached yet, mid-page, exactly a page, across many 16-key tiles (at
    # MAX_SPLITS, 11 splits of one tile each to merge).
    context_lens = [0, 5, block_size, 173]
    batch = make_paged_batch(10 + num_splits, [q_len] * 4, context_lens, num_heads,
                             num_kv_heads, head_dim, block_size, dtype, DEVICE)
    reshape_and_cache(batch.k_new, batch.v_new, batch.kv_cache, batch.slot_mapping)
    scale = head_dim ** -0.5
    out = paged_attention_decode(batch.q, batch.kv_cache, batch.block_table, batch.seq_lens,
                                 batch.query_start_loc, scale=scale, query_len=q_len,
                                 num_splits=num_splits, out=_nan_like(batch.q))
    assert rel_err(out, reference_attention(batch, scale)) <= tolerance(dtype)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_decode_graph_padding_requests(num_splits: int) -> None:
    """A graph-padding request (seq_len 0, or the decode length on the null block) must give
    finite rows, and never disturb the real requests."""
    q_len, block_size = 2, 4
    batch = make_paged_batch(20, [q_len] * 3, [9, 0, 0], 4, 2, 16, block_size, torch.float32,
                             DEVICE)
    reshape_and_cache(batch.k_new, batch.v_new, batch.kv_cache, batch.slot_mapping)
    null = batch.kv_cache[:, 0]
    null.zero_()  # padded tokens write here on the graph path: finite data
    batch.block_table[1:] = 0
    batch.seq_lens[1] = 0  # nothing at all to attend to
    batch.seq_lens[2] = q_len  # the runner's padding: the decode length on the null block
    out = paged_attention_decode(batch.q, batch.kv_cache, batch.block_table, batch.seq_lens,
                                 batch.query_start_loc, scale=0.25, query_len=q_len,
                                 num_splits=num_splits, out=_nan_like(batch.q))
    ref = reference_attention(batch, 0.25)
    assert rel_err(out[:q_len], ref[:q_len]) <= 1e-4
    assert torch.equal(out[q_len:2 * q_len], torch.zeros_like(out[q_len:2 * q_len]))
    assert torch.isfinite(out[2 * q_len:]).all()


@pytest.mark.parametrize(("dtype", "num_heads", "num_kv_heads", "head_dim", "block_size",
                          "num_spec_steps", "num_splits"),
                         [case for case in DECODE_CASES if case[-1] > 1])
def test_the_decode_kernel_merges_its_own_splits_to_the_merge_kernels_bits(
        dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
        num_spec_steps: int, num_splits: int) -> None:
    """With a count buffer the last split program of each (request, KV head) merges: the
    merge kernel's code in the same order, so the same bits, and the counts are left at zero
    for the next launch (a graph replay), which the second call runs on."""
    q_len = 1 + num_spec_steps
    batch = make_paged_batch(10 + num_splits, [q_len] * 4, [0, 5, block_size, 173], num_heads,
                             num_kv_heads, head_dim, block_size, dtype, DEVICE)
    reshape_and_cache(batch.k_new, batch.v_new, batch.kv_cache, batch.slot_mapping)
    args = (batch.q, batch.kv_cache, batch.block_table, batch.seq_lens, batch.query_start_loc)
    kw = dict(scale=head_dim ** -0.5, query_len=q_len, num_splits=num_splits)
    apart = paged_attention_decode(*args, **kw, out=_nan_like(batch.q))
    counts = merge_counts_for(4, num_kv_heads, torch.device(DEVICE))
    for _ in range(2):
        merged = paged_attention_decode(*args, **kw, out=_nan_like(batch.q),
                                        merge_counts=counts)
        assert torch.equal(merged, apart)
        assert not counts.any()
    with pytest.raises(ValueError, match="merge counts"):
        paged_attention_decode(*args, **kw, merge_counts=counts[:-1])


def test_the_backend_merges_decode_splits_in_the_decode_kernel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A uniform decode that splits (the backend planned for 132 SMs) launches no merge
    kernel and gives the reference's attention."""
    num_heads, num_kv_heads, head_dim, block_size = 8, 2, 16, 4
    batch = make_paged_batch(41, [1, 1], [60, 7], num_heads, num_kv_heads, head_dim,
                             block_size, torch.bfloat16, DEVICE)
    spec = AttentionSpec(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                         block_size=block_size, num_blocks=batch.kv_cache.shape[1],
                         max_blocks_per_req=64, max_num_reqs=4, max_num_tokens=32,
                         dtype=torch.bfloat16, device=torch.device(DEVICE))
    table = torch.zeros(2, 64, dtype=batch.block_table.dtype, device=DEVICE)
    table[:, :batch.block_table.shape[1]] = batch.block_table
    batch.block_table = table
    backend = TritonAttentionBackend(spec)
    backend._num_sms = 132
    assert backend.num_splits(2) > 1

    monkeypatch.setattr(_decode_merge, "merge_splits_kernel", _Unlaunchable())
    out = backend.forward(0, batch.q, batch.k_new, batch.v_new, batch.kv_cache,
                          _meta(batch, True))
    assert rel_err(out, reference_attention(batch, spec.scale)) <= 1e-2
    assert not backend._merge_counts.any()


class _Unlaunchable:
    """Stands in for a kernel that must not launch: indexing it with a grid fails."""

    def __getitem__(self, grid: object) -> object:
        raise AssertionError(f"the merge kernel was launched on grid {grid}")


VARLEN_CASES = [
    # dtype, num_heads, num_kv_heads, head_dim, block_size, q_lens, context_lens
    (torch.float32, 2, 2, 16, 4, [1, 7, 20, 4], [12, 0, 5, 33]),
    (torch.float32, 8, 2, 32, 16, [3, 1, 18], [0, 40, 17]),
    (torch.bfloat16, 8, 2, 16, 4, [9, 0, 1, 2], [30, 3, 7, 0]),
    (torch.bfloat16, 2, 2, 32, 16, [17, 4], [16, 35]),
]


@pytest.mark.parametrize(("dtype", "num_heads", "num_kv_heads", "head_dim", "block_size",
                          "q_lens", "context_lens"), VARLEN_CASES)
def test_paged_attention_varlen(dtype: torch.dtype, num_heads: int, num_kv_heads: int,
                                head_dim: int, block_size: int, q_lens: list[int],
                                context_lens: list[int]) -> None:
    batch = make_paged_batch(30 + len(q_lens), q_lens, context_lens, num_heads, num_kv_heads,
                             head_dim, block_size, dtype, DEVICE)
    reshape_and_cache(batch.k_new, batch.v_new, batch.kv_cache, batch.slot_mapping)
    scale = head_dim ** -0.5
    out = paged_attention_varlen(batch.q, batch.kv_cache, batch.block_table, batch.seq_lens,
                                 batch.query_start_loc, scale=scale,
                                 max_query_len=max(q_lens), out=_nan_like(batch.q))
    assert rel_err(out, reference_attention(batch, scale)) <= tolerance(dtype)


# ---------------------------------------------------------------- the backend

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


@pytest.mark.parametrize(("q_lens", "context_lens", "uniform"), [
    ([4, 4, 4], [3, 21, 0], True),  # uniform decode with 3 speculative tokens
    ([1, 6, 2], [19, 0, 8], False),  # mixed: decode + fresh prefill + prefill on a prefix
])
def test_backend_forward(q_lens: list[int], context_lens: list[int], uniform: bool) -> None:
    num_heads, num_kv_heads, head_dim, block_size = 8, 2, 16, 4
    batch = make_paged_batch(40, q_lens, context_lens, num_heads, num_kv_heads, head_dim,
                             block_size, torch.bfloat16, DEVICE)
    spec = AttentionSpec(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                         block_size=block_size, num_blocks=batch.kv_cache.shape[1],
                         max_blocks_per_req=batch.block_table.shape[1], max_num_reqs=4,
                         max_num_tokens=32, dtype=torch.bfloat16, device=torch.device(DEVICE))
    backend = TritonAttentionBackend(spec)
    assert backend.name == "triton"
    out = backend.forward(0, batch.q, batch.k_new, batch.v_new, batch.kv_cache,
                          _meta(batch, uniform))
    assert out.shape == batch.q.shape and out.dtype == torch.bfloat16
    assert rel_err(out, reference_attention(batch, spec.scale)) <= 1e-2


def test_choose_num_splits() -> None:
    # A big batch fills the GPU without splitting.
    assert choose_num_splits(64, 8, 4096, 132) == 1
    assert choose_num_splits(128, 8, 4096, 132) == 1
    # One request with a long context splits as far as allowed, in powers of two.
    assert choose_num_splits(1, 8, 8192, 132) == MAX_SPLITS
    assert choose_num_splits(1, 8, 512, 132) == 8  # >= one 64-key tile a split
    assert choose_num_splits(1, 8, 40, 132) == 1
    for num_reqs in range(1, 129):
        splits = choose_num_splits(num_reqs, 8, 1 << 17, 132)
        assert splits & (splits - 1) == 0 and 1 <= splits <= MAX_SPLITS
        # The grid fills 132 SMs at least twice over, unless the cap stops it.
        assert num_reqs * 8 * splits >= 2 * 132 or splits == MAX_SPLITS, num_reqs
        # ... and never more than needed: half the splits would not.
        assert splits == 1 or num_reqs * 8 * splits // 2 < 2 * 132, num_reqs


def test_triton_ops_matches_torch_ops_interface() -> None:
    for method in ("rms_norm", "silu_and_mul", "rotary"):
        assert (inspect.signature(getattr(TritonOps, method))
                == inspect.signature(getattr(TorchOps, method))), method
    assert TritonOps.name == "triton"
