"""The Triton kernels compiled for the GPU, at real model shapes, against float32 references.

Llama-3.2-1B-like attention (32 query heads, 8 KV heads, head_dim 64) and head_dim 128,
block_size 16, contexts up to ~4k tokens, batches up to 64, bf16. Also captures the decode
path and the varlen attention in CUDA graphs and replays them on other batches. Run in its
own process (`pytest tests/gpu`) or with the rest: the CPU kernel tests leave the compiler on
when CUDA is present.
"""

from __future__ import annotations

import pytest
import torch

# Skip before anything imports the kernels: on a CPU machine the CPU tests must be the first
# to define them (in the interpreter).
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

pytest.importorskip("triton")

from triton.runtime.interpreter import InterpretedFunction

from tests.paged_reference import (
    PagedBatch,
    make_paged_batch,
    reference_attention,
    rel_err,
)
from warmgate.server.kernels import (
    choose_num_splits,
    paged_attention_decode,
    paged_attention_varlen,
    reshape_and_cache,
)
from warmgate.server.kernels.decode_attention import _decode_kernel
from warmgate.server.kernels.ops import TritonOps
from warmgate.server.runner.attention.base import AttentionMetadata, AttentionSpec
from warmgate.server.runner.attention.triton_backend import TritonAttentionBackend
from warmgate.server.runner.ops import TorchOps, build_cos_sin_cache

if isinstance(_decode_kernel, InterpretedFunction):
    pytest.skip("TRITON_INTERPRET=1 is set: unset it to test the compiled kernels",
                allow_module_level=True)

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
DTYPE = torch.bfloat16
TOL = 1e-2
NUM_HEADS, NUM_KV_HEADS, BLOCK_SIZE = 32, 8, 16
MAX_CONTEXT = 4096
HEAD_DIMS = [64, 128]


def _num_sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def _batch(seed: int, q_lens: list[int], context_lens: list[int], head_dim: int) -> PagedBatch:
    batch = make_paged_batch(seed, q_lens, context_lens, NUM_HEADS, NUM_KV_HEADS, head_dim,
                             BLOCK_SIZE, DTYPE, DEVICE)
    reshape_and_cache(batch.k_new, batch.v_new, batch.kv_cache, batch.slot_mapping)
    return batch


def _batch_unwritten(seed: int, q_lens: list[int], context_lens: list[int],
                     head_dim: int) -> PagedBatch:
    """A batch whose new tokens are not in the cache yet (the graph's forward writes them)."""
    return make_paged_batch(seed, q_lens, context_lens, NUM_HEADS, NUM_KV_HEADS, head_dim,
                            BLOCK_SIZE, DTYPE, DEVICE)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_elementwise_ops(head_dim: int) -> None:
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    ops, ref_ops = TritonOps(), TorchOps()
    hidden, inter, num_tokens = 2048, 8192, 512
    x = torch.randn(num_tokens, hidden, generator=gen, device=DEVICE).to(DTYPE)
    residual = torch.randn(num_tokens, hidden, generator=gen, device=DEVICE).to(DTYPE)
    weight = (1 + 0.1 * torch.randn(hidden, generator=gen, device=DEVICE)).to(DTYPE)
    for res in (None, residual):
        out, new_res = ops.rms_norm(x, weight, 1e-5, res)
        ref_out, ref_res = ref_ops.rms_norm(x, weight, 1e-5, res)
        assert rel_err(out, ref_out) <= TOL and rel_err(new_res, ref_res) <= TOL
    gate_up = torch.randn(num_tokens, 2 * inter, generator=gen, device=DEVICE).to(DTYPE)
    assert rel_err(ops.silu_and_mul(gate_up), ref_ops.silu_and_mul(gate_up)) <= TOL
    cache = build_cos_sin_cache(8192, head_dim, 500000.0, DEVICE)
    positions = torch.randint(0, 8192, (num_tokens,), generator=gen, device=DEVICE)
    q = torch.randn(num_tokens, NUM_HEADS, head_dim, generator=gen, device=DEVICE).to(DTYPE)
    k = torch.randn(num_tokens, NUM_KV_HEADS, head_dim, generator=gen, device=DEVICE).to(DTYPE)
    (q_out, k_out), (q_ref, k_ref) = (ops.rotary(q, k, positions, cache),
                                      ref_ops.rotary(q, k, positions, cache))
    assert rel_err(q_out, q_ref) <= TOL and rel_err(k_out, k_ref) <= TOL


def test_reshape_and_cache() -> None:
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    num_blocks, head_dim, num_tokens = 512, 128, 1024
    kv_cache = torch.full((2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, head_dim), float("nan"),
                          dtype=DTYPE, device=DEVICE)
    slots = torch.randperm(num_blocks * BLOCK_SIZE, generator=gen, device=DEVICE)[:num_tokens]
    slots[::7] = -1
    k = torch.randn(num_tokens, NUM_KV_HEADS, head_dim, generator=gen, device=DEVICE).to(DTYPE)
    v = torch.randn(num_tokens, NUM_KV_HEADS, head_dim, generator=gen, device=DEVICE).to(DTYPE)
    reshape_and_cache(k, v, kv_cache, slots)
    flat = kv_cache.view(2, -1, NUM_KV_HEADS, head_dim)
    keep = slots >= 0
    assert torch.equal(flat[0, slots[keep]], k[keep])
    assert torch.equal(flat[1, slots[keep]], v[keep])
    assert int((~flat.isnan()).sum()) == 2 * int(keep.sum()) * NUM_KV_HEADS * head_dim


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
# 128 requests of 8 KV heads: head size 64's wide-grid tile (decode_attention.MANY_PROGRAMS).
@pytest.mark.parametrize("num_reqs", [1, 8, 64, 128])
@pytest.mark.parametrize("num_spec_steps", [0, 3])
def test_paged_attention_decode(head_dim: int, num_reqs: int, num_spec_steps: int) -> None:
    q_len = 1 + num_spec_steps
    gen = torch.Generator().manual_seed(100 + num_reqs)
    contexts = torch.randint(0, MAX_CONTEXT - q_len, (num_reqs,), generator=gen).tolist()
    contexts[0] = MAX_CONTEXT - q_len  # the longest context the spec allows
    batch = _batch(num_reqs + head_dim, [q_len] * num_reqs, contexts, head_dim)
    ref = reference_attention(batch, head_dim ** -0.5)
    auto = choose_num_splits(num_reqs, NUM_KV_HEADS, MAX_CONTEXT, _num_sms())
    for num_splits in sorted({1, auto}):
        out = paged_attention_decode(
            batch.q, batch.kv_cache, batch.block_table, batch.seq_lens, batch.query_start_loc,
            scale=head_dim ** -0.5, query_len=q_len, num_splits=num_splits,
            out=torch.full_like(batch.q, float("nan")))
        assert rel_err(out, ref) <= TOL, f"num_splits={num_splits}"


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_paged_attention_varlen(head_dim: int) -> None:
    # Decodes, short and long prefills, fresh and on cached prefixes, in one mixed batch.
    q_lens = [1, 1, 4, 300, 1000, 17, 2048, 1]
    contexts = [4000, 50, 0, 2000, 0, 700, 1024, 4095]
    batch = _batch(7 + head_dim, q_lens, contexts, head_dim)
    out = paged_attention_varlen(
        batch.q, batch.kv_cache, batch.block_table, batch.seq_lens, batch.query_start_loc,
        scale=head_dim ** -0.5, max_query_len=max(q_lens),
        out=torch.full_like(batch.q, float("nan")))
    assert rel_err(out, reference_attention(batch, head_dim ** -0.5)) <= TOL


# A ragged graph's bucket of token rows and of requests, and the batches one captured graph
# replays: decodes and drafts beside prompts (both varlen launches attend), prompts alone (the
# decodes' launch finds nothing), short requests alone (the prompts' launch finds nothing).
VARLEN_BUCKET, VARLEN_REQS = 256, 8
VARLEN_MIXES = [
    ([1, 1, 37, 4, 1, 100, 2], [500, 3000, 0, 64, 1, 200, 77]),
    ([120, 60, 50], [0, 1000, 10]),
    ([1, 1, 1, 1, 4, 4, 1, 1], [4000, 10, 512, 0, 7, 300, 2048, 33]),
]


class _StaticVarlen:
    """The buffers a captured ragged graph's varlen attention reads, padded as the runner
    pads them: q rows past the batch's tokens, requests of no tokens past its requests."""

    def __init__(self, batches: list[PagedBatch], head_dim: int) -> None:
        num_blocks = max(b.kv_cache.shape[1] for b in batches)
        width = max(b.block_table.shape[1] for b in batches)
        self.kv_cache = torch.empty((2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, head_dim),
                                    dtype=DTYPE, device=DEVICE)
        self.block_table = torch.zeros((VARLEN_REQS, width), dtype=torch.int32, device=DEVICE)
        self.q = torch.empty((VARLEN_BUCKET, NUM_HEADS, head_dim), dtype=DTYPE, device=DEVICE)
        self.out = torch.empty_like(self.q)
        self.seq_lens = torch.zeros(VARLEN_REQS, dtype=torch.int32, device=DEVICE)
        self.query_start_loc = torch.zeros(VARLEN_REQS + 1, dtype=torch.int32, device=DEVICE)
        self.scale = head_dim ** -0.5

    def load(self, batch: PagedBatch) -> None:
        tokens, reqs = sum(batch.q_lens), batch.num_reqs
        self.kv_cache.fill_(float("nan"))
        self.kv_cache[:, :batch.kv_cache.shape[1]].copy_(batch.kv_cache)
        self.block_table.zero_()
        self.block_table[:reqs, :batch.block_table.shape[1]].copy_(batch.block_table)
        self.q.fill_(float("nan"))
        self.q[:tokens].copy_(batch.q)
        self.seq_lens.zero_()
        self.seq_lens[:reqs].copy_(batch.seq_lens)
        self.query_start_loc.fill_(tokens)  # the padding requests start and end at the end
        self.query_start_loc[:reqs + 1].copy_(batch.query_start_loc)
        self.out.fill_(float("nan"))

    def attend(self) -> torch.Tensor:
        return paged_attention_varlen(
            self.q, self.kv_cache, self.block_table, self.seq_lens, self.query_start_loc,
            scale=self.scale, max_query_len=VARLEN_BUCKET, out=self.out, num_reqs=VARLEN_REQS)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_varlen_cuda_graph_replays_any_mix_of_decodes_and_prompts(head_dim: int) -> None:
    """One graph captured at a bucket, replayed on batches whose requests are decodes,
    prompts or both: each request goes to the launch its length calls for on the device, and
    rows no request owns stay untouched."""
    batches = [_batch(20 + i, q_lens, contexts, head_dim)
               for i, (q_lens, contexts) in enumerate(VARLEN_MIXES)]
    step = _StaticVarlen(batches, head_dim)
    step.load(batches[0])
    step.attend()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step.attend()
    for batch in (*batches[1:], batches[0]):
        step.load(batch)
        graph.replay()
        torch.cuda.synchronize()
        tokens = sum(batch.q_lens)
        assert rel_err(step.out[:tokens], reference_attention(batch, step.scale)) <= TOL
        assert torch.isnan(step.out[tokens:]).all()


class _StaticStep:
    """Static buffers a captured decode graph reads, refilled from a PagedBatch per replay."""

    def __init__(self, batches: list[PagedBatch], head_dim: int) -> None:
        first = batches[0]
        num_blocks = max(b.kv_cache.shape[1] for b in batches)
        width = max(b.block_table.shape[1] for b in batches)
        self.kv_cache = torch.empty((2, num_blocks, BLOCK_SIZE, NUM_KV_HEADS, head_dim),
                                    dtype=DTYPE, device=DEVICE)
        self.block_table = torch.zeros((first.num_reqs, width), dtype=torch.int32, device=DEVICE)
        self.q, self.k, self.v = first.q.clone(), first.k_new.clone(), first.v_new.clone()
        self.seq_lens = first.seq_lens.clone()
        self.query_start_loc = first.query_start_loc.clone()
        self.slot_mapping = first.slot_mapping.clone()
        self.positions = first.positions.clone()

    def load(self, batch: PagedBatch) -> None:
        """Everything but the new tokens' K/V, which the captured forward writes itself."""
        self.kv_cache.fill_(float("nan"))
        self.kv_cache[:, :batch.kv_cache.shape[1]].copy_(batch.kv_cache)
        self.block_table.zero_()
        self.block_table[:, :batch.block_table.shape[1]].copy_(batch.block_table)
        for name in ("q", "seq_lens", "query_start_loc", "slot_mapping", "positions"):
            getattr(self, name).copy_(getattr(batch, name))
        self.k.copy_(batch.k_new)
        self.v.copy_(batch.v_new)

    def meta(self, q_len: int) -> AttentionMetadata:
        num_reqs = self.seq_lens.shape[0]
        return AttentionMetadata(
            num_reqs=num_reqs, num_tokens=num_reqs * q_len, max_query_len=q_len,
            max_seq_len=MAX_CONTEXT, query_start_loc=self.query_start_loc,
            seq_lens=self.seq_lens, block_table=self.block_table,
            slot_mapping=self.slot_mapping, positions=self.positions,
            query_start_loc_cpu=self.query_start_loc.cpu(), seq_lens_cpu=self.seq_lens.cpu(),
            is_uniform_decode=True, for_cuda_graph=True)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_decode_cuda_graph_replay(head_dim: int) -> None:
    """Capture the backend's decode path once, replay it on other lengths and pages."""
    num_reqs, q_len = 8, 4
    gen = torch.Generator().manual_seed(5)
    batches = [
        _batch_unwritten(seed, [q_len] * num_reqs,
                         torch.randint(0, MAX_CONTEXT - q_len, (num_reqs,),
                                       generator=gen).tolist(), head_dim)
        for seed in (1, 2)]
    step = _StaticStep(batches, head_dim)
    spec = AttentionSpec(num_heads=NUM_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=head_dim,
                         block_size=BLOCK_SIZE, num_blocks=step.kv_cache.shape[1],
                         max_blocks_per_req=step.block_table.shape[1], max_num_reqs=num_reqs,
                         max_num_tokens=num_reqs * q_len, dtype=DTYPE,
                         device=torch.device(DEVICE))
    backend = TritonAttentionBackend(spec)
    meta = step.meta(q_len)
    step.load(batches[0])
    backend.forward(0, step.q, step.k, step.v, step.kv_cache, meta)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(0, step.q, step.k, step.v, step.kv_cache, meta)
    for batch in (batches[1], batches[0]):
        step.load(batch)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, reference_attention(batch, spec.scale)) <= TOL

