"""The decode kernel's in-kernel split merge and rotation in the binaries, without a GPU:
compiled for sm_90 at every preset's query rows, GQA group, head size and q/k norm (k 0 and 3;
tests/decode_spill_probe.py),
the decode kernel spills no register to local memory and, at 16 query rows, keeps within 128
registers a thread (four programs of 128 threads an SM), in each tile the GPU runs. A change to
the kernel or its merge that costs more registers than that fails here, where on a GPU it would
only be slower."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from tests.probe_run import run_probe
from warmgate.server.config.runner_config import preset_names


def test_the_decode_kernel_with_its_merge_spills_nothing_for_any_preset() -> None:
    reports = run_probe("tests.decode_spill_probe")
    covered = {p for r in reports for p in r["presets"]}
    assert covered == {f"{name} k{k}" for name in preset_names() for k in (0, 3)}
    for r in reports:
        assert r["MMA"], r  # the GPU's binary, not the interpreter's float32 products
        assert r["MERGE"] and r["ROPE"] and r["STACK"] == 0, r
        assert r["BLOCK_M"] > 16 or r["REG"] <= 128, r
    # The GPU's tiles, not the interpreter's 16-key one: at head size 64 both of the server's,
    # a narrow grid's and a wide one's (decode_attention._decode_config).
    tiles = {(r["HEAD_DIM"], tuple(r["TILE"])) for r in reports}
    assert {(64, (64, 4, 2)), (64, (32, 2, 4)), (128, (64, 4, 2))} <= tiles
    assert all(tile[0] >= 32 for _, tile in tiles)
