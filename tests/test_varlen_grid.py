"""The varlen attention kernel's grid: a program per query block a request needs, found from
query_start_loc on the device, where every request once got the longest query's blocks.

A CUDA graph of a ragged bucket launches with the bucket as its longest query and pads with
requests of no tokens; a decode beside a prompt needs one block where the prompt needs many.
Each test here checks what the kernel writes against the dense reference (the same cases
as tests/test_triton_kernels.py's, a program in the wrong place leaves NaN or a wrong row).

Requests of a few tokens (decodes, drafts) run in a second launch of small tiles, one program
a request, which the first launch skips: each launch must attend for its own requests and
leave the other's rows alone.
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


def _attend(batch: Any, short_query_len: int | None = None, **tensors: Any) -> torch.Tensor:
    args = dict(q=batch.q, block_table=batch.block_table, seq_lens=batch.seq_lens,
                query_start_loc=batch.query_start_loc, max_query_len=max(Q_LENS)) | tensors
    q = args.pop("q")
    return paged_attention_varlen(
        q, batch.kv_cache, args["block_table"], args["seq_lens"], args["query_start_loc"],
        scale=HEAD_DIM ** -0.5, max_query_len=args["max_query_len"],
        out=torch.full_like(q, NAN), short_query_len=short_query_len)


class _GridRecorder:
    """Stands in for the kernel: records each launch's grid, then launches it."""

    def __init__(self, kernel: Any, drop: int | None = None) -> None:
        self.kernel, self.grids, self.drop = kernel, [], drop

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        self.grids.append(grid)
        if len(self.grids) - 1 == self.drop:  # this launch does not run
            return lambda *args, **kwargs: None
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


SHORT = 4  # the decodes' launch takes requests of up to 4 tokens (Q_LENS has 1, 2 and 4)


def _rows(q_lens: list[int], short: bool) -> torch.Tensor:
    """The token rows of the requests of at most SHORT tokens (short) or of more."""
    return torch.tensor([(q <= SHORT) == short for q in q_lens for _ in range(q)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decodes_beside_prompts_run_in_a_launch_of_their_own(
        dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    batch = _batch(dtype)
    recorder = _GridRecorder(varlen_attention._varlen_kernel)
    monkeypatch.setattr(varlen_attention, "_varlen_kernel", recorder)
    out = _attend(batch, short_query_len=SHORT)
    assert rel_err(out, reference_attention(batch, HEAD_DIM ** -0.5)) <= tolerance(dtype)
    block_q = varlen_tiles(HEAD_DIM, dtype, DEVICE == "cuda")[0] // (HEADS // KV_HEADS)
    assert recorder.grids == [(sum(Q_LENS) // block_q + len(Q_LENS), KV_HEADS),
                              (len(Q_LENS), KV_HEADS)]  # a program a request and KV head


@pytest.mark.parametrize("dropped", [0, 1], ids=["prompts' launch", "decodes' launch"])
def test_each_launch_leaves_the_others_requests_alone(dropped: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With one of the two launches not run, its requests' rows stay NaN and the other's are
    right: neither launch attends for the other's requests, nor misses one of its own."""
    batch = _batch(torch.bfloat16)
    monkeypatch.setattr(varlen_attention, "_varlen_kernel",
                        _GridRecorder(varlen_attention._varlen_kernel, drop=dropped))
    out = _attend(batch, short_query_len=SHORT).cpu()
    reference = reference_attention(batch, HEAD_DIM ** -0.5).cpu()
    ran = _rows(Q_LENS, short=dropped == 0)
    assert torch.isnan(out[~ran]).all()
    assert rel_err(out[ran], reference[ran]) <= tolerance(torch.bfloat16)


def test_the_default_splits_where_the_decodes_tile_is_smaller(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the GPU's wide tiles (here 64 rows) the default takes the decodes apart in tiles
    of 16; a batch of nothing but short requests runs their launch alone."""
    monkeypatch.setattr(varlen_attention, "varlen_tiles", lambda *_: (64, 16, 4, 1))
    batch = _batch(torch.bfloat16)
    recorder = _GridRecorder(varlen_attention._varlen_kernel)
    monkeypatch.setattr(varlen_attention, "_varlen_kernel", recorder)
    out = _attend(batch)
    assert rel_err(out, reference_attention(batch, HEAD_DIM ** -0.5)) <= 1e-2
    assert recorder.grids == [(sum(Q_LENS) // 16 + len(Q_LENS), KV_HEADS),
                              (len(Q_LENS), KV_HEADS)]
    short_lens = [1, 4, 0, 2, 1]
    short = make_paged_batch(3, short_lens, [30, 5, 7, 63, 0], HEADS, KV_HEADS, HEAD_DIM,
                             PAGE, torch.bfloat16, DEVICE)
    reshape_and_cache(short.k_new, short.v_new, short.kv_cache, short.slot_mapping)
    recorder.grids.clear()
    out = paged_attention_varlen(short.q, short.kv_cache, short.block_table, short.seq_lens,
                                 short.query_start_loc, scale=HEAD_DIM ** -0.5,
                                 max_query_len=max(short_lens))
    assert rel_err(out, reference_attention(short, HEAD_DIM ** -0.5)) <= 1e-2
    assert recorder.grids == [(len(short_lens), KV_HEADS)]
