"""The torch paged-attention backend against a dense causal GQA reference."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from warmgate.server.config.runner_config import cdiv
from warmgate.server.runner.attention import AttentionMetadata, AttentionSpec, create_backend
from warmgate.server.runner.batch import is_uniform_decode

HQ, HK, D, BS, NUM_BLOCKS, MAX_BLOCKS = 8, 2, 16, 4, 64, 12


def spec() -> AttentionSpec:
    return AttentionSpec(num_heads=HQ, num_kv_heads=HK, head_dim=D, block_size=BS,
                         num_blocks=NUM_BLOCKS, max_blocks_per_req=MAX_BLOCKS, max_num_reqs=8,
                         max_num_tokens=256, dtype=torch.float32, device=torch.device("cpu"))


def dense_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One request's whole sequence: q [S, Hq, D], k, v [S, Hk, D] -> [S, Hq, D]."""
    k = k.repeat_interleave(HQ // HK, dim=1)
    v = v.repeat_interleave(HQ // HK, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1),
                                         v.transpose(0, 1), is_causal=True)
    return out.transpose(0, 1)


def metadata(computed: list[int], query: list[int], tables: list[list[int]],
             decode_query_len: int) -> AttentionMetadata:
    seq_lens = [c + n for c, n in zip(computed, query, strict=True)]
    qsl = [0]
    for n in query:
        qsl.append(qsl[-1] + n)
    table = torch.zeros(len(query), MAX_BLOCKS, dtype=torch.int32)
    slots, positions = [], []
    for i, (c, n) in enumerate(zip(computed, query, strict=True)):
        table[i, :len(tables[i])] = torch.tensor(tables[i], dtype=torch.int32)
        for p in range(c, c + n):
            positions.append(p)
            slots.append(tables[i][p // BS] * BS + p % BS)
    qsl_t = torch.tensor(qsl, dtype=torch.int32)
    seq_t = torch.tensor(seq_lens, dtype=torch.int32)
    return AttentionMetadata(
        num_reqs=len(query), num_tokens=sum(query), max_query_len=max(query),
        max_seq_len=max(seq_lens), query_start_loc=qsl_t, seq_lens=seq_t, block_table=table,
        slot_mapping=torch.tensor(slots), positions=torch.tensor(positions),
        query_start_loc_cpu=qsl_t.clone(), seq_lens_cpu=seq_t.clone(),
        is_uniform_decode=is_uniform_decode(sum(query), len(query), max(query),
                                            decode_query_len, any_prefill=False))


def _einsum_form_not_called(*args: object) -> None:
    raise AssertionError("the fused form was asked for; the einsum form ran")


@pytest.mark.parametrize("fused", [False, True], ids=["einsum", "fused"])
@pytest.mark.parametrize("decode_query_len", [1, 3])
def test_paged_steps_match_dense_attention(decode_query_len: int, fused: bool) -> None:
    """Requests of different lengths: a ragged prefill, then uniform decode steps, then a
    mixed step (a chunk of 6 after earlier tokens: its mask ends at the sequence's end);
    every step's output equals dense causal attention over the whole sequence. Both forms
    of the ragged loop: the CPU's einsums and CUDA's fused kernel (torch's SDPA here too)."""
    torch.manual_seed(0)
    rng = random.Random(decode_query_len)
    backend = create_backend("torch", spec())
    assert not backend.fused_requests  # the CPU's default
    if fused:
        backend.fused_requests = True
        backend._attend = _einsum_form_not_called  # type: ignore[method-assign]
    cache = torch.zeros(2, NUM_BLOCKS, BS, HK, D)
    lengths = [5, 9, 1, 14]
    total = [n + 3 * decode_query_len + 6 for n in lengths]
    free = list(range(1, NUM_BLOCKS))
    rng.shuffle(free)  # blocks scattered over the cache, not in order
    tables = [[free.pop() for _ in range(cdiv(t, BS))] for t in total]
    q_all = [torch.randn(t, HQ, D) for t in total]
    k_all = [torch.randn(t, HK, D) for t in total]
    v_all = [torch.randn(t, HK, D) for t in total]
    expected = [dense_reference(q, k, v) for q, k, v in zip(q_all, k_all, v_all, strict=True)]

    computed = [0] * len(lengths)
    steps = ([lengths] + [[decode_query_len] * len(lengths)] * 3
             + [[decode_query_len, 6, decode_query_len, 1]])
    kinds = []
    for query in steps:
        meta = metadata(computed, query, tables, decode_query_len)
        kinds.append(meta.is_uniform_decode)
        sl = [slice(c, c + n) for c, n in zip(computed, query, strict=True)]
        q = torch.cat([qa[s] for qa, s in zip(q_all, sl, strict=True)])
        k = torch.cat([ka[s] for ka, s in zip(k_all, sl, strict=True)])
        v = torch.cat([va[s] for va, s in zip(v_all, sl, strict=True)])
        out = backend.forward(0, q, k, v, cache, meta)
        want = torch.cat([e[s] for e, s in zip(expected, sl, strict=True)])
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
        computed = [c + n for c, n in zip(computed, query, strict=True)]
    assert kinds == [False, True, True, True, False]


def test_uniform_decode_under_graph_width_and_padding() -> None:
    """for_cuda_graph reads the full block-table width; a padded request (seq_len 0 rows on
    the null block) stays finite and does not disturb the real ones."""
    torch.manual_seed(1)
    backend = create_backend("torch", spec())
    cache = torch.zeros(2, NUM_BLOCKS, BS, HK, D)
    seq = 7
    q_all, k_all, v_all = torch.randn(seq, HQ, D), torch.randn(seq, HK, D), torch.randn(seq, HK, D)
    table = [3, 9]
    prefill = metadata([0], [seq - 1], [table], 1)
    backend.forward(0, q_all[:-1], k_all[:-1], v_all[:-1], cache, prefill)
    # The second request is padding: one token at slot 0 of the null block.
    meta = metadata([seq - 1, 0], [1, 1], [table, [0]], 1)
    meta.for_cuda_graph = True
    q = torch.cat([q_all[-1:], torch.randn(1, HQ, D)])
    k = torch.cat([k_all[-1:], torch.zeros(1, HK, D)])
    v = torch.cat([v_all[-1:], torch.zeros(1, HK, D)])
    out = backend.forward(0, q, k, v, cache, meta)
    assert meta.is_uniform_decode and torch.isfinite(out).all()
    want = dense_reference(q_all, k_all, v_all)[-1:]
    torch.testing.assert_close(out[:1], want, atol=1e-5, rtol=1e-5)
