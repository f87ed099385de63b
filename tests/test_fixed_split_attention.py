"""--deterministic's fixed-split attention kernel (kernels/fixed_split_attention.py): a token's
output is the same bits in a whole-prompt prefill, chunked prefills cut anywhere, decodes and
verification steps, each run either way (one program folding its splits, or split programs
and a merge), alone and beside other requests; it matches a float64 reference; split boundaries and
graph padding hold.

The split size is two key tiles (32 keys under the interpreter's 16-key tiles), so the short
sequences here cross several split boundaries. On a machine with CUDA the interpreter is not
forced and the same checks run the compiled kernels (64-key tiles, so 128-key splits).
"""

from __future__ import annotations

from functools import partial
from itertools import pairwise

import pytest
import torch

pytest.importorskip("triton")

from tests.fixed_split_helpers import (
    BLOCK_SIZE,
    Part,
    Request,
    cdiv,
    make_request,
    reference_rows,
    run_step,
)
from tests.kernel_device import kernel_device
from warmgate.server.kernels import fixed_split_attention
from warmgate.server.kernels.fixed_split_attention import _fixed_split_kernel, fold_rows, key_tile

DEVICE = kernel_device(_fixed_split_kernel)

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 16  # GQA: 2 query heads a KV head
C = 2 * key_tile(HEAD_DIM, torch.float32, DEVICE == "cuda")  # the split size under test
LENGTH = 3 * C + 5  # the probe request crosses three split boundaries
TABLE_WIDTH = cdiv(LENGTH, BLOCK_SIZE) + 2
MAX_SPLITS = cdiv(TABLE_WIDTH * BLOCK_SIZE, C)  # what the workspace holds
# Positions on and beside every split boundary.
EDGES = [0, 1, C - 2, C - 1, C, C + 1, 2 * C - 1, 2 * C, 3 * C, LENGTH - 1]


def _request(seed: int, length: int, dtype: torch.dtype, heads: int = NUM_HEADS,
             kv_heads: int = NUM_KV_HEADS) -> Request:
    return make_request(seed, length, heads, kv_heads, HEAD_DIM, dtype, DEVICE)


def _step(parts: list[Part], programs: int, dtype: torch.dtype, seed: int = 0,
          heads: int = NUM_HEADS, kv_heads: int = NUM_KV_HEADS) -> list[torch.Tensor]:
    return run_step(parts, split_keys=C, split_programs=programs, table_width=TABLE_WIDTH,
                    seed=seed, num_heads=heads, num_kv_heads=kv_heads, head_dim=HEAD_DIM,
                    dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_a_token_is_the_same_bits_in_every_path(dtype: torch.dtype) -> None:
    probe = _request(1, LENGTH, dtype)
    longer, shorter = _request(2, LENGTH + 3, dtype), _request(3, C - 3, dtype)
    whole = _step([Part(probe, 0, LENGTH)], 1, dtype)[0]  # one prefill of the whole prompt

    # Chunked prefills, cut across and beside the boundaries, each chunk beside a prefill
    # chunk and a decode of other requests (the pages shuffled anew every step), the splits
    # walked in one program or run apart.
    for cuts, programs in (([0, 7, C + 1, 2 * C, LENGTH], 1),
                           ([0, C - 1, C, 2 * C + 1, LENGTH], 1),
                           ([0, 5, 2 * C - 1, LENGTH], MAX_SPLITS)):
        rows = []
        for i, (lo, hi) in enumerate(pairwise(cuts)):
            parts = [Part(longer, 9 * i, 5 + i), Part(probe, lo, hi - lo),
                     Part(shorter, C - 5, 1)]
            rows.append(_step(parts, programs, dtype, seed=i)[1])
        assert torch.equal(torch.cat(rows), whole), (cuts, programs)

    # Decodes at every edge position in one batch, beside other requests' decodes, with the
    # splits walked in one program (1) or run apart and merged (3: the first program holds
    # splits 0 and 3, the others one each; all: one each). Two programs: test_split_boundaries.
    decodes = [Part(longer, 2 * C + 6, 1), *(Part(probe, p, 1) for p in EDGES),
               Part(shorter, 3, 1)]
    for programs in (1, 3, MAX_SPLITS):
        got = _step(decodes, programs, dtype, seed=programs)[1:-1]
        assert torch.equal(torch.cat(got), whole[EDGES]), programs
    # ... and alone.
    for p in (C, LENGTH - 1):
        for programs in (1, MAX_SPLITS):
            assert torch.equal(_step([Part(probe, p, 1)], programs, dtype)[0], whole[p:p + 1])

    # Verification steps (1 + 3 drafts), windows across the boundaries, beside another.
    starts = [0, C - 2, 2 * C - 3, LENGTH - 4]
    verify = [*(Part(probe, s, 4) for s in starts), Part(longer, 17, 4)]
    for programs in (1, MAX_SPLITS):
        got = _step(verify, programs, dtype, seed=7)[:-1]
        assert torch.equal(torch.cat(got), torch.cat([whole[s:s + 4] for s in starts]))


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 2), (2, 2), (4, 1)])
def test_matches_a_float64_reference(heads: int, kv_heads: int) -> None:
    a, b = (_request(s, LENGTH, torch.float32, heads, kv_heads) for s in (4, 5))
    step = partial(_step, dtype=torch.float32, heads=heads, kv_heads=kv_heads)
    mixed = [Part(a, C - 3, 2 * C), Part(b, 0, C + 1), Part(a, LENGTH - 1, 1)]
    decode = [Part(a, p, 1) for p in EDGES] + [Part(b, 2 * C, 1)]
    # The mixed batch in one program, the decodes either way.
    for parts, n in ((mixed, 1), (decode, 1), (decode, MAX_SPLITS)):
        for part, rows in zip(parts, step(parts, n), strict=True):
            assert part.request is not None
            ref = reference_rows(part.request, part.start, part.q_len)
            assert rows.shape == ref.shape
            assert float((rows.double() - ref).abs().max()) <= 1e-5, (part.start, part.q_len)


def test_split_boundaries() -> None:
    """seq_len 1, C - 1, C, C + 1, 2C, 2C + 1, 3C: decodes either way agree with each other,
    with the prefill's row and with the reference."""
    probe = _request(6, LENGTH, torch.float32)
    whole = _step([Part(probe, 0, LENGTH)], 1, torch.float32)[0]
    seq_lens = [1, C - 1, C, C + 1, 2 * C, 2 * C + 1, 3 * C]
    parts = [Part(probe, n - 1, 1) for n in seq_lens]
    for programs in (1, 2, MAX_SPLITS):
        for n, rows in zip(seq_lens, _step(parts, programs, torch.float32), strict=True):
            assert torch.equal(rows, whole[n - 1:n]), (programs, n)
            ref = reference_rows(probe, n - 1, 1)
            assert float((rows.double() - ref).abs().max()) <= 1e-5, (programs, n)


@pytest.mark.parametrize("programs", [1, MAX_SPLITS])
def test_graph_padding_gives_zeros_or_finite_rows_and_leaves_the_rest_alone(
        programs: int) -> None:
    probe = _request(8, LENGTH, torch.float32)
    real = [Part(probe, C + 3, 2), Part(probe, 2 * C - 1, 2)]
    alone = [_step([p], programs, torch.float32)[0] for p in real]
    parts = [real[0], Part(None, -2, 2), Part(None, 0, 2), real[1], Part(None, -2, 2)]
    out = _step(parts, programs, torch.float32, seed=3)
    assert torch.equal(out[0], alone[0]) and torch.equal(out[3], alone[1])
    for empty in (out[1], out[4]):  # seq_len 0: nothing to attend to, zeros and no NaN
        assert torch.equal(empty, torch.zeros_like(empty))
    assert torch.isfinite(out[2]).all()  # the decode length on the (zeroed) null block


def test_a_request_with_no_query_tokens_leaves_the_others_of_its_prefill_alone() -> None:
    probe = _request(8, LENGTH, torch.float32)
    prefill = _step([Part(probe, 0, 0), Part(probe, 0, C + 2)], 1, torch.float32)
    whole = _step([Part(probe, 0, LENGTH)], 1, torch.float32)[0]
    assert prefill[0].shape[0] == 0 and torch.equal(prefill[1], whole[:C + 2])


def test_the_fold_takes_rows_of_its_own_that_fit_its_registers() -> None:
    # llama-3.1-8b (group 4, head_dim 128) under the attention's 128 rows: 16, not 128.
    assert fold_rows(128, 4, 128) == 16
    assert fold_rows(128, 4, 64) == 32  # llama-3.2-1b
    assert fold_rows(16, 2, 16) == 16  # never more than the attention's
    assert fold_rows(128, 8, 512) == 8  # at least a token's query heads
    assert fold_rows(128, 3, 2048) == 4


def test_the_folds_row_blocks_do_not_change_a_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fold in programs of one token's query heads (not the attention's row block): the
    same bits as walking the splits in one program, for prefill chunks, decodes and
    verifications beside other requests."""
    monkeypatch.setattr(fixed_split_attention, "FOLD_TILE_ELEMENTS", 16)
    assert fold_rows(16, NUM_HEADS // NUM_KV_HEADS, 16) == 2  # block_q 1 against the kernel's 8
    probe, other = _request(9, LENGTH, torch.float32), _request(10, LENGTH + 3, torch.float32)
    steps = ([Part(other, 4, 3), Part(probe, C - 3, C + 9)],  # a chunk across two boundaries
             [Part(other, 2 * C, 1), *(Part(probe, p, 1) for p in EDGES)],
             [Part(probe, C - 2, 4), Part(other, 2 * C - 3, 4)])
    for parts in steps:
        walked = _step(parts, 1, torch.float32, seed=2)
        apart = _step(parts, MAX_SPLITS, torch.float32, seed=2)
        for a, b in zip(walked, apart, strict=True):
            assert torch.equal(a, b), [(p.start, p.q_len) for p in parts]
