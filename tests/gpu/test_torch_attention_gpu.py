"""The torch backend's ragged loop on CUDA: each request in one fused attention kernel, the
einsum form's result, and the same kernels whatever the prompt's length (the einsum form's
cuBLAS GEMMs changed with it, and a GEMM shape's first call is slow)."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from warmgate.server.runner.attention import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    create_backend,
)

pytestmark = pytest.mark.gpu

HQ, HK, D, BS, NUM_BLOCKS, MAX_BLOCKS = 32, 8, 64, 16, 128, 32  # Llama-3.2-1B's heads


def _spec(dtype: torch.dtype) -> AttentionSpec:
    return AttentionSpec(num_heads=HQ, num_kv_heads=HK, head_dim=D, block_size=BS,
                         num_blocks=NUM_BLOCKS, max_blocks_per_req=MAX_BLOCKS, max_num_reqs=4,
                         max_num_tokens=512, dtype=dtype, device=torch.device("cuda"))


def _step(computed: list[int], query: list[int]) -> tuple[AttentionMetadata, int]:
    """A ragged step: request i has computed[i] tokens cached and query[i] new ones, in
    blocks from 1 + 14 * i on (disjoint up to 224 tokens a request; the null block unused)."""
    seq_lens = [c + n for c, n in zip(computed, query, strict=True)]
    qsl = [0]
    for n in query:
        qsl.append(qsl[-1] + n)
    table = torch.zeros(len(query), MAX_BLOCKS, dtype=torch.int32)
    slots = []
    for i, (c, n) in enumerate(zip(computed, query, strict=True)):
        first = 1 + 14 * i
        table[i] = torch.arange(first, first + MAX_BLOCKS, dtype=torch.int32)
        slots += [(first + p // BS) * BS + p % BS for p in range(c, c + n)]
    qsl_t = torch.tensor(qsl, dtype=torch.int32)
    seq_t = torch.tensor(seq_lens, dtype=torch.int32)
    meta = AttentionMetadata(
        num_reqs=len(query), num_tokens=sum(query), max_query_len=max(query),
        max_seq_len=max(seq_lens), query_start_loc=qsl_t.cuda(), seq_lens=seq_t.cuda(),
        block_table=table.cuda(), slot_mapping=torch.tensor(slots).cuda(),
        positions=torch.zeros(sum(query), dtype=torch.long).cuda(),
        query_start_loc_cpu=qsl_t, seq_lens_cpu=seq_t, is_uniform_decode=False)
    return meta, sum(query)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_requests_give_the_einsum_form(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    backend = create_backend("torch", _spec(dtype))
    assert backend.fused_requests  # CUDA's default
    cache = torch.randn(2, NUM_BLOCKS, BS, HK, D, device="cuda").to(dtype)
    # A whole prompt, a chunk after 40 cached tokens, a decode row after 200: three masks.
    meta, tokens = _step([0, 40, 200], [37, 23, 1])
    q = torch.randn(tokens, HQ, D, device="cuda").to(dtype)
    k = torch.randn(tokens, HK, D, device="cuda").to(dtype)
    v = torch.randn(tokens, HK, D, device="cuda").to(dtype)
    fused = backend.forward(0, q, k, v, cache.clone(), meta)
    backend.fused_requests = False
    einsum = backend.forward(0, q, k, v, cache.clone(), meta)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4  # outputs rounded to bf16 in the first
    torch.testing.assert_close(fused, einsum, atol=tol, rtol=tol)


def _kernels(backend: AttentionBackend, length: int) -> set[str]:
    """The kernels one prompt of `length` tokens launches in the ragged loop."""
    meta, tokens = _step([0], [length])
    q = torch.randn(tokens, HQ, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(tokens, HK, D, device="cuda", dtype=torch.bfloat16)
    cache = torch.zeros(2, NUM_BLOCKS, BS, HK, D, device="cuda", dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        backend.forward(0, q, k, k, cache, meta)
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if e.device_type.name == "CUDA"}


def test_a_new_prompt_length_launches_no_kernel_the_warm_ones_did_not() -> None:
    backend = create_backend("torch", _spec(torch.bfloat16))
    # About the warmup's prefill (2 + k tokens) and the serving rehearsal's (64).
    seen = _kernels(backend, 5) | _kernels(backend, 64)
    for length in (37, 128, 300):
        assert _kernels(backend, length) <= seen, length
