"""The varlen attention kernel's grid: a program per query block a request needs, found from
query_start_loc on the device, where every request once got the longest query's blocks.

A CUDA graph of a ragged bucket launches with the bucket as its longest query and pads with
requests of no tokens; a decode beside a prompt needs one block where the prompt needs many.
Each test here checks what the kernel writes against the dense reference (the same cases
as tests/test_triton_kernels.py's, a program in the wrong place leaves NaN or a wrong row).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("triton")

import warmgate.server.kernels.varlen_attention as varlen_attention
from tests.kernel_device import kernel_device
from tests.paged_reference import (
    NAN,
    make_paged_batch,
    reference_attention,
    rel_err,
    tolerance,
)
from warmgate.server.kernels import reshape_and_cache
from warmgate.server.kernels.varlen_attention import paged_attention_varlen, varlen_tiles

DEVICE = kernel_device(varlen_attention._varlen_kernel)
HEADS, KV_HEADS, HEAD_DIM, PAGE = 8, 2, 16, 4
# Decodes (1 token), drafts (4), prompts crossing the 16-row tile's 4-token blocks, and none.
Q_LENS = [1, 1, 9, 4, 0, 1, 17, 1, 4, 2, 1]
CONTEXTS = [30, 5, 0, 12, 7, 63, 3, 0, 21, 16, 40]


def _batch(dtype: torch.dtype) -> Any:
    batch = make_paged_batch(7, Q_LENS, CONTEXTS, HEADS, KV_HEADS, HEAD_DIM, PAGE, dtype,
                             DEVICE)
    reshape_and_cache(batch.k_new, batch.v_new, batch.kv_cache, batch.slot_mapping)
    return batch


def _attend(batch: Any, **tensors: Any) -> torch.Tensor:
    args = dict(q=batch.q, block_table=batch.block_table, seq_lens=batch.seq_lens,
                query_start_loc=batch.query_start_loc, max_query_len=max(Q_LENS)) | tensors
    q = args.pop("q")
    return paged_attention_varlen(
        q, batch.kv_cache, args["block_table"], args["seq_lens"], args["query_start_loc"],
        scale=HEAD_DIM ** -0.5, max_query_len=args["max_query_len"],
        out=torch.full_like(q, NAN))


class _GridRecorder:
    """Stands in for the kernel: records each launch's grid, then launches it."""

    def __init__(self, kernel: Any) -> None:
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        self.grids.append(grid)
        return self.kernel[grid]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_program_per_block_each_request_needs(dtype: torch.dtype,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    batch = _batch(dtype)
    recorder = _GridRecorder(varlen_attention._varlen_kernel)
    monkeypatch.setattr(varlen_attention, "_varlen_kernel", recorder)
    out = _attend(batch)
    assert rel_err(out, reference_attention(batch, HEAD_DIM ** -0.5)) <= tolerance(dtype)
    block_m = varlen_tiles(HEAD_DIM, dtype, DEVICE == "cuda")[0]
    block_q = block_m // (HEADS // KV_HEADS)
    # 45 tokens in blocks of 4 beside 11 requests, where 5 blocks (the 17-token prompt's)
    # for each of the 11 requests was the grid before.
    assert recorder.grids == [(sum(Q_LENS) // block_q + len(Q_LENS), KV_HEADS)]


def test_requests_past_one_chunk_find_their_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program compares REQ_CHUNK requests' first blocks at a time: with chunks of 4 the
    eleven requests take three, and every row comes out as with one."""
    batch = _batch(torch.bfloat16)
    whole = _attend(batch)
    monkeypatch.setattr(varlen_attention, "REQ_CHUNK", 4)
    assert torch.equal(_attend(batch), whole)


def test_a_ragged_graphs_padding_is_left_alone() -> None:
    """As a captured bucket replays: the batch's requests, then requests of no tokens starting
    at the batch's end, q rows no request owns, and the bucket as the longest query."""
    batch = _batch(torch.bfloat16)
    tokens, pad_reqs, bucket = sum(Q_LENS), 5, 64
    q = torch.cat([batch.q, torch.full((bucket - tokens, HEADS, HEAD_DIM), NAN,
                                       dtype=batch.q.dtype, device=DEVICE)])
    end = batch.query_start_loc[-1:].expand(pad_reqs)
    out = _attend(
        batch, q=q, max_query_len=bucket,
        query_start_loc=torch.cat([batch.query_start_loc, end]),
        seq_lens=torch.cat([batch.seq_lens, torch.zeros_like(batch.seq_lens[:pad_reqs])]),
        block_table=torch.cat([batch.block_table,
                               torch.zeros_like(batch.block_table[:1]).expand(pad_reqs, -1)]))
    reference = reference_attention(batch, HEAD_DIM ** -0.5)
    assert rel_err(out[:tokens], reference) <= tolerance(torch.bfloat16)
    assert torch.isnan(out[tokens:]).all()
