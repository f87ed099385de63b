"""The varlen attention kernel's two launches in the binaries, without a GPU: compiled for
sm_90 at every preset's GQA group and head size (tests/varlen_spill_probe.py), the prompts'
launch of wide tiles and the decodes' launch of small ones both run on the tensor cores and
spill no register to local memory, and the decodes' tile is the smaller one for every preset,
so a mixed step on the GPU does take the decodes apart."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from tests.probe_run import run_probe
from warmgate.server.config.runner_config import preset_names
from warmgate.server.kernels.varlen_attention import LONG, SHORT


def test_both_varlen_launches_spill_nothing_for_any_preset() -> None:
    reports = run_probe("tests.varlen_spill_probe")
    assert {p for r in reports for p in r["presets"]} == set(preset_names())
    by_shape: dict[tuple[int, int], dict[int, int]] = {}
    for r in reports:
        assert r["MMA"], r  # the GPU's binary, not the interpreter's float32 products
        assert r["STACK"] == 0, r
        by_shape.setdefault((r["GROUP"], r["HEAD_DIM"]), {})[r["SELECT"]] = r["BLOCK_M"]
    for shape, block_m in by_shape.items():
        assert block_m[SHORT.value] < block_m[LONG.value], (shape, block_m)
