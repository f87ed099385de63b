"""The decode kernel's tile follows its grid: at head size 64, from MANY_PROGRAMS programs on
(llama-3.2-1b's 8 KV heads at batch 128), 32-key tiles on 2 warps pipelined 4 deep, which an
H100 read at 76-85% of its bandwidth against 64-67% on the 64-key tiles. The GPU's choice is
a pure function checked here; the wide tile's 32-key steps are checked for correctness in the
interpreter, which otherwise runs 16-key tiles only."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests.kernel_device import kernel_device
from tests.paged_reference import make_paged_batch, reference_attention, rel_err, tolerance
from warmgate.server.kernels import decode_attention, paged_attention_decode, reshape_and_cache
from warmgate.server.kernels.decode_attention import (
    MANY_PROGRAMS,
    _decode_config,
    _decode_kernel,
    merge_counts_for,
)

DEVICE = kernel_device(_decode_kernel)
WIDE_TILE = (32, 2, 4)


def test_head_size_64_takes_the_thin_tiles_from_many_programs_on() -> None:
    bf16 = torch.bfloat16
    assert _decode_config(64, bf16, True, MANY_PROGRAMS - 1) == (64, 4, 2)
    assert _decode_config(64, bf16, True, MANY_PROGRAMS) == WIDE_TILE
    assert _decode_config(64, torch.float16, True, 8 * MANY_PROGRAMS) == WIDE_TILE
    # Head size 128 read fastest on the 64-key tiles at every batch measured.
    assert _decode_config(128, bf16, True, 8 * MANY_PROGRAMS) == (64, 4, 2)
    assert _decode_config(64, torch.float32, True, 8 * MANY_PROGRAMS) == (32, 4, 2)
    assert _decode_config(64, bf16, False, 8 * MANY_PROGRAMS) == (16, 4, 1)


def test_the_launch_asks_for_the_tile_of_its_requests_by_kv_heads(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Requests x KV heads, fixed per captured graph and rising with the batch (the splits,
    which fall as it rises, left out), so the warmup's largest decode compiles the wide tile."""
    asked: list[int] = []
    real = decode_attention._decode_config

    def spy(head_dim: int, dtype: torch.dtype, on_gpu: bool, programs: int = 0
            ) -> tuple[int, int, int]:
        asked.append(programs)
        return real(head_dim, dtype, on_gpu, programs)

    monkeypatch.setattr(decode_attention, "_decode_config", spy)
    batch = make_paged_batch(24, [1] * 4, [3, 9, 20, 40], 4, 2, 16, 4, torch.float32, DEVICE)
    reshape_and_cache(batch.k_new, batch.v_new, batch.kv_cache, batch.slot_mapping)
    paged_attention_decode(batch.q, batch.kv_cache, batch.block_table, batch.seq_lens,
                           batch.query_start_loc, scale=0.25, query_len=1, num_splits=3)
    assert asked == [4 * 2]


@pytest.mark.parametrize(("num_spec_steps", "num_splits"), [(0, 1), (3, 1), (0, 4)])
def test_the_wide_grids_tile_attends_like_the_reference(
        monkeypatch: pytest.MonkeyPatch, num_spec_steps: int, num_splits: int) -> None:
    """llama-3.2-1b's head size and GQA group on the GPU's wide-grid tile: 32-key steps over
    16-token pages, contexts that end mid-page, on a tile boundary and across many tiles, and
    splits merged in the kernel."""
    monkeypatch.setattr(decode_attention, "_decode_config",
                        lambda head_dim, dtype, on_gpu, programs=0: WIDE_TILE)
    q_len = 1 + num_spec_steps
    batch = make_paged_batch(64, [q_len] * 4, [0, 5, 32 - q_len, 173], 8, 2, 64, 16,
                             torch.bfloat16, DEVICE)
    reshape_and_cache(batch.k_new, batch.v_new, batch.kv_cache, batch.slot_mapping)
    counts = merge_counts_for(4, 2, torch.device(DEVICE)) if num_splits > 1 else None
    out = paged_attention_decode(batch.q, batch.kv_cache, batch.block_table, batch.seq_lens,
                                 batch.query_start_loc, scale=0.125, query_len=q_len,
                                 num_splits=num_splits, merge_counts=counts,
                                 out=torch.full_like(batch.q, float("nan")))
    assert rel_err(out, reference_attention(batch, 0.125)) <= tolerance(torch.bfloat16)
