"""The GEMV with the RMSNorm and SiLU-and-mul fused in, in the binaries, without a GPU:
compiled for sm_90 at every dense preset's gate/up shape, at one row and at the 16-row tile
(tests/gemv_spill_probe.py), it spills no register to local memory. Its epilogue holds the
gate and up columns of a tile at once and splits them apart; a change that made that cost
local memory would fail here, where on a GPU it would only be slower."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from tests.probe_run import run_probe
from warmgate.server.config.runner_config import ModelConfig, preset_names


def test_the_norm_and_act_fused_gemv_spills_nothing_for_any_dense_preset() -> None:
    reports = run_probe("tests.gemv_spill_probe")
    dense = {name for name in preset_names()
             if not ModelConfig.from_preset(name).num_experts
             and ModelConfig.from_preset(name).fp8 is None}
    assert {p for r in reports for p in r["presets"]} == dense
    assert sorted({r["BLOCK_M"] for r in reports}) == [1, 16]
    for r in reports:
        assert r["ACT"] and r["STACK"] == 0, r
