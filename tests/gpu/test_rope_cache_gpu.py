"""The fused rotary + KV-cache-write kernel compiled for the GPU, at real model shapes.

It must produce exactly the bits of the two kernels it replaces (the rotary kernel, then
reshape_and_cache): same float32 arithmetic, one rounding; with Qwen3's q/k norm, the values
of the per-head rms_norm launches before them up to their sum of squares' order. Both cache
layouts, padding slots, prefill-sized and decode-sized batches, a CUDA-graph replay, and each
attention backend's forward with the rope fused against the unfused path.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

pytest.importorskip("triton")

from triton.runtime.interpreter import InterpretedFunction

from tests.paged_reference import assert_fused_decode_close, make_paged_batch
from warmgate.server.kernels._decode_rope import rotates_in_decode
from warmgate.server.kernels.kv_cache import reshape_and_cache
from warmgate.server.kernels.rms_norm import rms_norm
from warmgate.server.kernels.rope_cache import _rope_cache_kernel, rope_and_cache
from warmgate.server.kernels.rotary import rotary_embedding
from warmgate.server.runner.attention import backend_available, create_backend
from warmgate.server.runner.attention.base import AttentionMetadata, AttentionSpec, RopeInput
from warmgate.server.runner.ops import build_cos_sin_cache

if isinstance(_rope_cache_kernel, InterpretedFunction):
    pytest.skip("TRITON_INTERPRET=1 is set: unset it to test the compiled kernels",
                allow_module_level=True)

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
DTYPE = torch.bfloat16
BLOCK_SIZE = 16
MAX_POS = 8192


def _qkv(num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, seed: int
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen,
                      device=DEVICE).to(DTYPE)  # the fused projection's output
    q_end, k_end = num_heads * head_dim, (num_heads + num_kv_heads) * head_dim
    return (qkv[:, :q_end].view(num_tokens, num_heads, head_dim),
            qkv[:, q_end:k_end].view(num_tokens, num_kv_heads, head_dim),
            qkv[:, k_end:].view(num_tokens, num_kv_heads, head_dim))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"),
                         [(32, 8, 128), (32, 8, 64), (16, 2, 128), (40, 8, 128)])
@pytest.mark.parametrize("num_tokens", [1, 64, 777])
def test_matches_rotary_then_cache_write(layout: str, num_heads: int, num_kv_heads: int,
                                         head_dim: int, num_tokens: int) -> None:
    num_blocks = 2 + num_tokens // BLOCK_SIZE * 2
    q, k, v = _qkv(num_tokens, num_heads, num_kv_heads, head_dim, seed=num_tokens)
    cos_sin = build_cos_sin_cache(MAX_POS, head_dim, 500000.0, DEVICE)
    positions = torch.randint(0, MAX_POS, (num_tokens,), device=DEVICE)
    slots = (torch.randperm((num_blocks - 1) * BLOCK_SIZE, device=DEVICE)[:num_tokens]
             + BLOCK_SIZE)
    slots[::7] = -1  # tokens with nothing to cache
    nhd = torch.full((2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim), float("nan"),
                     dtype=DTYPE, device=DEVICE)
    ref_cache = nhd.clone()
    ref_q, ref_k = rotary_embedding(q, k, positions, cos_sin)
    reshape_and_cache(ref_k, v, ref_cache, slots)
    if layout == "NHD":
        key_cache, value_cache = nhd[0], nhd[1]
    else:  # HND storage, viewed back as NHD for the comparison
        hnd = nhd.transpose(2, 3).contiguous()
        key_cache, value_cache = hnd[0], hnd[1]
    q_rot = rope_and_cache(q, k, v, positions, cos_sin, key_cache, value_cache, slots,
                           layout=layout)  # type: ignore[arg-type]
    assert q_rot.is_contiguous() and torch.equal(q_rot, ref_q)
    got = (nhd if layout == "NHD"
           else torch.stack([key_cache, value_cache]).transpose(2, 3))
    assert torch.equal(got.nan_to_num(7.0), ref_cache.nan_to_num(7.0))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(16, 8), (32, 4)])  # Qwen3 0.6B, 30B
@pytest.mark.parametrize("num_tokens", [1, 64, 777])
def test_qk_norm_matches_the_norms_then_rotary_then_cache_write(
        layout: str, num_heads: int, num_kv_heads: int, num_tokens: int) -> None:
    """With Qwen3's q/k norm weights the kernel replaces two per-head rms_norm launches too:
    the same values up to the norm's sum of squares, taken as two halves, rounding apart
    (bf16 hides that almost always; where it shows, an ulp of the normalised value, which a
    rotated element near 0 keeps as an absolute error)."""
    head_dim, eps = 128, 1e-6
    num_blocks = 2 + num_tokens // BLOCK_SIZE * 2
    q, k, v = _qkv(num_tokens, num_heads, num_kv_heads, head_dim, seed=num_tokens + 1)
    gen = torch.Generator(device=DEVICE).manual_seed(num_heads)
    q_weight, k_weight = (torch.rand(head_dim, generator=gen, device=DEVICE).add(0.5).to(DTYPE)
                          for _ in range(2))
    cos_sin = build_cos_sin_cache(MAX_POS, head_dim, 1000000.0, DEVICE)
    positions = torch.randint(0, MAX_POS, (num_tokens,), device=DEVICE)
    slots = (torch.randperm((num_blocks - 1) * BLOCK_SIZE, device=DEVICE)[:num_tokens]
             + BLOCK_SIZE)
    slots[::7] = -1
    nhd = torch.full((2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim), float("nan"),
                     dtype=DTYPE, device=DEVICE)
    ref_cache = nhd.clone()
    q_normed, _ = rms_norm(q.reshape(-1, head_dim), q_weight, eps)
    k_normed, _ = rms_norm(k.reshape(-1, head_dim), k_weight, eps)
    ref_q, ref_k = rotary_embedding(q_normed.view(q.shape), k_normed.view(k.shape), positions,
                                    cos_sin)
    reshape_and_cache(ref_k, v, ref_cache, slots)
    if layout == "NHD":
        key_cache, value_cache = nhd[0], nhd[1]
    else:
        hnd = nhd.transpose(2, 3).contiguous()
        key_cache, value_cache = hnd[0], hnd[1]
    q_rot = rope_and_cache(q, k, v, positions, cos_sin, key_cache, value_cache, slots,
                           layout=layout, q_norm_weight=q_weight,  # type: ignore[arg-type]
                           k_norm_weight=k_weight, eps=eps)
    got = (nhd if layout == "NHD"
           else torch.stack([key_cache, value_cache]).transpose(2, 3))
    for out, ref in ((q_rot, ref_q), (got.nan_to_num(7.0), ref_cache.nan_to_num(7.0))):
        torch.testing.assert_close(out, ref, rtol=2 ** -7, atol=2 ** -6)
        assert float((out != ref).float().mean()) <= 0.01


def test_cuda_graph_replay_reads_new_positions_and_slots() -> None:
    num_tokens, num_heads, num_kv_heads, head_dim, num_blocks = 64, 32, 8, 128, 16
    q, k, v = _qkv(num_tokens, num_heads, num_kv_heads, head_dim, seed=9)
    cos_sin = build_cos_sin_cache(MAX_POS, head_dim, 500000.0, DEVICE)
    positions = torch.zeros(num_tokens, dtype=torch.int64, device=DEVICE)
    slots = torch.full((num_tokens,), -1, dtype=torch.int64, device=DEVICE)
    cache = torch.zeros(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, dtype=DTYPE,
                        device=DEVICE)
    q_out = torch.empty_like(q, memory_format=torch.contiguous_format)
    rope_and_cache(q, k, v, positions, cos_sin, cache[0], cache[1], slots, q_out=q_out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rope_and_cache(q, k, v, positions, cos_sin, cache[0], cache[1], slots, q_out=q_out)
    for seed in (1, 2):
        gen = torch.Generator(device=DEVICE).manual_seed(seed)
        positions.copy_(torch.randint(0, MAX_POS, (num_tokens,), generator=gen, device=DEVICE))
        slots.copy_(torch.randperm(num_blocks * BLOCK_SIZE, generator=gen, device=DEVICE)
                    [:num_tokens])
        cache.zero_()
        graph.replay()
        ref_cache = torch.zeros_like(cache)
        ref_q, ref_k = rotary_embedding(q, k, positions, cos_sin)
        reshape_and_cache(ref_k, v, ref_cache, slots)
        assert torch.equal(q_out, ref_q) and torch.equal(cache, ref_cache)


@pytest.mark.parametrize("backend_name", ["triton", "flashinfer"])
@pytest.mark.parametrize(("q_lens", "context_lens", "uniform"), [
    ([1] * 8, [5, 17, 300, 0, 1000, 64, 15, 2], True),
    ([1, 40, 3], [100, 0, 50], False),
])
def test_backend_forward_fused_equals_unfused(backend_name: str, q_lens: list[int],
                                              context_lens: list[int], uniform: bool) -> None:
    if not backend_available(backend_name):
        pytest.skip(f"{backend_name} is not installed")
    num_heads, num_kv_heads, head_dim = 32, 8, 128
    batch = make_paged_batch(3, q_lens, context_lens, num_heads, num_kv_heads, head_dim,
                             BLOCK_SIZE, DTYPE, DEVICE)
    # FlashInfer reads a request's whole last page (0 * NaN past the end would be NaN).
    batch.kv_cache.nan_to_num_(0.0)
    spec = AttentionSpec(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                         block_size=BLOCK_SIZE, num_blocks=batch.kv_cache.shape[1],
                         max_blocks_per_req=batch.block_table.shape[1],
                         max_num_reqs=len(q_lens), max_num_tokens=sum(q_lens), dtype=DTYPE,
                         device=torch.device(DEVICE))
    backend = create_backend(backend_name, spec)
    assert backend.fuses_rope
    meta = AttentionMetadata(
        num_reqs=len(q_lens), num_tokens=sum(q_lens), max_query_len=max(q_lens),
        max_seq_len=int(batch.seq_lens.max()), query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens, block_table=batch.block_table,
        slot_mapping=batch.slot_mapping, positions=batch.positions,
        query_start_loc_cpu=batch.query_start_loc.cpu(), seq_lens_cpu=batch.seq_lens.cpu(),
        is_uniform_decode=uniform, block_table_cpu=batch.block_table.cpu())
    cos_sin = build_cos_sin_cache(MAX_POS, head_dim, 500000.0, DEVICE)
    rot_q, rot_k = rotary_embedding(batch.q, batch.k_new, batch.positions, cos_sin)
    unfused_cache = batch.kv_cache.clone()
    backend.plan(meta)
    unfused = backend.forward(0, rot_q, rot_k, batch.v_new, unfused_cache, meta)
    fused = backend.forward(0, batch.q, batch.k_new, batch.v_new, batch.kv_cache, meta,
                            RopeInput(batch.positions, cos_sin))
    if backend_name == "triton" and uniform and rotates_in_decode(head_dim):
        # The decode kernel rotates and writes the cache itself: rounded apart, not the bits.
        assert_fused_decode_close(fused, unfused, batch.kv_cache, unfused_cache)
        return
    assert torch.isfinite(fused).all() and torch.equal(fused, unfused)
    assert torch.equal(batch.kv_cache, unfused_cache)


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
@pytest.mark.parametrize("backend_name", ["triton", "flashinfer"])
def test_a_decode_step_runs_the_fused_kernel_and_not_the_three(backend_name: str,
                                                               architecture: str) -> None:
    """The proof in the profile: a runner's decode step launches none of the kernels the
    fused rope replaced (rotary, reshape_and_cache, FlashInfer's index_copy), and with Qwen3's
    q/k norm no per-head RMSNorm either: two a layer and the final one. On FlashInfer the
    rope is _rope_cache_kernel; on triton, at this power-of-two head_dim, the decode kernel
    rotates and writes the cache itself, so not even _rope_cache_kernel runs."""
    if not backend_available(backend_name):
        pytest.skip(f"{backend_name} is not installed")
    from torch.profiler import ProfilerActivity, profile

    from tests.runner_helpers import MiniScheduler, prompt, tiny_config
    from warmgate.server.runner.model_runner import ModelRunner

    runner = ModelRunner(tiny_config(device="cuda", dtype="bfloat16",
                                     attention_backend=backend_name, block_size=16,
                                     num_blocks=64, max_model_len=256, max_num_seqs=4,
                                     max_num_batched_tokens=256, num_heads=32, num_kv_heads=8,
                                     head_dim=64, hidden_size=2048, intermediate_size=2048,
                                     num_layers=2, vocab_size=32000,
                                     architecture=architecture))
    sched = MiniScheduler(runner)
    for rid, n in (("a", 9), ("b", 30)):
        sched.add(rid, prompt(n, offset=n))
    sched.step()  # prefill
    sched.step()  # a first decode: every kernel compiled before the profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        sched.step()
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages()]
    in_decode = backend_name == "triton" and rotates_in_decode(runner.config.model.head_dim)
    assert any("_rope_cache_kernel" in n for n in names) is not in_decode, names
    assert not in_decode or any("_decode_kernel" in n for n in names), names
    replaced = ("_rotary_kernel", "_reshape_and_cache_kernel", "index_copy")
    assert not [n for n in names if any(r in n for r in replaced)], names
    norms = sum(e.count for e in prof.key_averages() if "_rms_norm_kernel" in e.key)
    assert norms == 2 * len(runner.model.layers) + 1, names
