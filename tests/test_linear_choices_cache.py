"""The dense linears' choices kept in the compile cache entry (cache/linear_choices.py): a cold
start times them and writes the file, a warm one presets them and times nothing (same choices,
so a restart keeps every linear's kernel); a file of another GPU or libraries, of another
format, unreadable or lacking a planned pair is ignored (everything is timed again) with the
reason said; a cache volume that cannot be written costs the next start only. A pair preset
for the GEMV runs it once before ready, so its binary is loaded then too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

from tests.test_linear_tuning import FakeTimer, _choices, _runner
from warmgate.server.cache.linear_choices import (
    LINEARS_FILE,
    load_linear_choices,
    save_linear_choices,
)
from warmgate.server.kernels import dense_gemv as dense_gemv_module
from warmgate.server.kernels import norm_gemv as norm_gemv_module
from warmgate.server.kernels.gemv_plan import rows_bucket
from warmgate.server.kernels.linear_choices import LINEAR, NORM, NORM_ACT, SILU_MUL, key_name
from warmgate.server.runner.linear_tuning import choose_linears, planned_keys
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.warmup.graphs_phase import choose_kept_linears
from warmgate.server.warmup.kernel_probe import kernel_identity

IDENTITY = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.13"}
CHOICES = {"48x80:bfloat16:m1": True, "48x80:bfloat16:m2": False}


class Alternating(FakeTimer):
    """The GEMV wins at odd row counts: the choices are not all alike."""

    def __call__(self, weights: Any, m: int, op: str) -> tuple[float, float]:
        super().__call__(weights, m, op)
        return (2e-6, 1e-6) if m % 2 else (1e-6, 2e-6)


def _never(*_: Any) -> tuple[float, float]:
    raise AssertionError("a warm start times nothing")


def test_the_file_round_trips_and_says_why_it_is_ignored(tmp_path: Path) -> None:
    names = list(CHOICES)
    assert load_linear_choices(tmp_path, IDENTITY, names) == (
        None, f"no {tmp_path / LINEARS_FILE} yet")
    save_linear_choices(tmp_path, IDENTITY, CHOICES)
    assert load_linear_choices(tmp_path, IDENTITY, names) == (CHOICES, "")
    assert load_linear_choices(tmp_path, IDENTITY, names[:1]) == (dict([*CHOICES.items()][:1]),
                                                                  "")
    kept, why = load_linear_choices(tmp_path, {**IDENTITY, "torch": "2.14"}, names)
    assert kept is None and "was timed on" in why
    kept, why = load_linear_choices(tmp_path, IDENTITY, [*names, "48x80:bfloat16:m3"])
    assert kept is None and why.endswith("lacks 48x80:bfloat16:m3")
    path = tmp_path / LINEARS_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), "version": 0}))
    kept, why = load_linear_choices(tmp_path, IDENTITY, names)
    assert kept is None and "has format 0" in why
    path.write_text("{not json")
    kept, why = load_linear_choices(tmp_path, IDENTITY, names)
    assert kept is None and "is unreadable (JSONDecodeError" in why


def test_a_warm_start_presets_them_and_times_nothing(tmp_path: Path) -> None:
    cold = _runner(timer=Alternating(), num_spec=3, max_num_seqs=4)
    first = choose_kept_linears(cold, tmp_path)
    assert first["timed"] and str(first["source"]).startswith("timed (no ")
    assert (tmp_path / LINEARS_FILE).exists()
    warm = _runner(timer=None, num_spec=3, max_num_seqs=4)
    _choices(warm).timer = _never
    second = choose_kept_linears(warm, tmp_path)
    assert second["timed"] == 0 and second["source"] == "the compile cache"
    assert _choices(warm).by_name() == _choices(cold).by_name()
    assert any(_choices(warm).by_name().values()) and not all(_choices(warm).by_name().values())
    assert _choices(warm).filled


def test_a_file_of_another_gpu_is_timed_over_and_rewritten(tmp_path: Path) -> None:
    cold = _runner(timer=Alternating(), max_num_seqs=2)
    names = [key_name(key) for key in planned_keys(cold, 16)]
    save_linear_choices(tmp_path, {"gpu": "another"}, dict.fromkeys(names, True))
    info = choose_kept_linears(cold, tmp_path)
    assert info["timed"] and "was timed on {'gpu': 'another'}" in str(info["source"])
    kept, _ = load_linear_choices(tmp_path, kernel_identity(cold.device),
                                  list(_choices(cold).by_name()))
    assert kept == _choices(cold).by_name()


def test_an_unwritable_cache_is_a_warning_not_a_failure(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    info = choose_kept_linears(_runner(timer=Alternating(), max_num_seqs=2), blocked)
    assert info["timed"]
    assert any("choices not kept" in r.getMessage() for r in caplog.records)


def test_a_pair_preset_for_the_gemv_runs_it_once_before_ready(
        monkeypatch: pytest.MonkeyPatch) -> None:
    runner: ModelRunner = _runner(timer=Alternating(), num_spec=3, max_num_seqs=4)
    choose_linears(runner)
    gemv = set(_choices(runner).gemv_keys())
    assert gemv and len(gemv) < len(planned_keys(runner, 16))
    warm = _runner(timer=None, num_spec=3, max_num_seqs=4)
    _choices(warm).timer = _never
    _choices(warm).preset({key: key in gemv for key in planned_keys(runner, 16)})
    monkeypatch.setattr(warm, "device", torch.device("cuda"))
    ran: list[tuple[str, int, int, int]] = []
    for op, name in ((LINEAR, "dense_gemv"), (SILU_MUL, "silu_mul_gemv")):
        monkeypatch.setattr(dense_gemv_module, name, lambda x, w, op=op: ran.append(
            (op, *w.shape, rows_bucket(x.shape[0]))))
    # The norm-fused GEMV twice: with a residual and without (layer 0's), a binary each.
    monkeypatch.setattr(norm_gemv_module, "norm_gemv", lambda x, r, nw, eps, w: ran.append(
        (f"{NORM} {'with' if r is not None else 'without'}", *w.shape, rows_bucket(x.shape[0]))))
    monkeypatch.setattr(norm_gemv_module, "norm_act_gemv", lambda x, r, nw, eps, w: ran.append(
        (NORM_ACT, *w.shape, rows_bucket(x.shape[0]))))
    assert choose_linears(warm)["timed"] == 0
    assert sorted(ran) == sorted({(name, n, k, rows_bucket(m)) for op, n, k, _, m in gemv
                                  for name in ([f"{NORM} with", f"{NORM} without"]
                                               if op == NORM else [op])})
    assert {op for op, *_ in ran} == {LINEAR, SILU_MUL, f"{NORM} with", f"{NORM} without",
                                      NORM_ACT}
