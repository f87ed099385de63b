"""The choice between cuBLAS and the Triton GEMV per (N, K, dtype, M) (kernels.linear_choices)
and TritonOps.linear, which follows it.

A decision keeps the faster of the two timings (cuBLAS unless the GEMV wins by the margin),
one per key, each said in one log line with both times. A lookup never times: above the
bound it is cuBLAS, and a key the warmup did not decide is cuBLAS too, counted and logged
once as a miss once the warmup has filled the choices (before that, every linear is cuBLAS
by design and nothing is a miss)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from warmgate.server.kernels import ops as triton_ops
from warmgate.server.kernels.dense_gemv import dense_gemv
from warmgate.server.kernels.invariant_ops import BatchInvariantOps
from warmgate.server.kernels.linear_choices import (
    LINEAR,
    MAX_M,
    NORM,
    NORM_ACT,
    SILU_MUL,
    LinearChoices,
)
from warmgate.server.kernels.ops import TritonOps

BF16 = torch.bfloat16


def _weight(n: int = 48, k: int = 80, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(n)).to(dtype)


def test_a_decision_keeps_the_faster_and_says_both_times(
        caplog: pytest.LogCaptureFixture) -> None:
    choices = LinearChoices()
    with caplog.at_level(logging.INFO, logger="warmgate.server.kernels.linear_choices"):
        assert choices.decide((LINEAR, 48, 80, BF16, 1), default_s=10e-6, gemv_s=7e-6)
        assert not choices.decide((LINEAR, 48, 80, BF16, 2), default_s=7e-6, gemv_s=10e-6)
        assert not choices.decide((LINEAR, 48, 80, BF16, 3), default_s=10e-6,
                                  gemv_s=9.95e-6)  # noise
    w = _weight()
    assert [choices.use_gemv(m, w) for m in (1, 2, 3)] == [True, False, False]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[0] == ("dense linear 48x80:bfloat16:m1: cuBLAS 10.0 us, Triton GEMV 7.0 us "
                        "-> Triton GEMV")
    assert lines[1].endswith("-> cuBLAS")
    assert [(d.m, d.gemv) for d in choices.decisions] == [(1, True), (2, False), (3, False)]
    assert choices.gemv_keys() == [(LINEAR, 48, 80, BF16, 1)]


def test_the_key_is_shape_dtype_and_rows() -> None:
    choices = LinearChoices()
    choices.decide((LINEAR, 48, 80, BF16, 4), default_s=2.0, gemv_s=1.0)
    assert choices.use_gemv(4, _weight())
    assert not choices.use_gemv(4, _weight(), SILU_MUL)
    assert not choices.use_gemv(4, _weight(dtype=torch.float16))
    assert not choices.use_gemv(4, _weight(n=64))
    assert not choices.use_gemv(5, _weight())


def test_a_miss_is_cublas_counted_and_logged_once_never_timed(
        caplog: pytest.LogCaptureFixture) -> None:
    choices = LinearChoices()

    def timer(*_: Any) -> tuple[float, float]:
        raise AssertionError("a lookup must never time")

    choices.timer = timer
    w = _weight()
    assert not choices.use_gemv(3, w) and choices.misses == 0  # not filled: by design
    choices.filled = True
    with caplog.at_level(logging.WARNING, logger="warmgate.server.kernels.linear_choices"):
        assert not choices.use_gemv(3, w)
        assert not choices.use_gemv(3, w)
        assert not choices.use_gemv(MAX_M + 1, w)  # above the bound: cuBLAS, not a miss
        assert not choices.use_gemv(0, w)  # no rows: nothing launches, not a miss
    assert choices.misses == 2
    assert [r.getMessage() for r in caplog.records] == [
        "dense linear 48x80:bfloat16:m3: not timed by the warmup, runs cuBLAS (1 misses so "
        "far)"]


@pytest.fixture
def gemv_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """(rows, with a bias) of every dense_gemv call TritonOps makes."""
    calls: list[tuple[int, bool]] = []
    real = triton_ops.dense_gemv

    def recording(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
                  ) -> torch.Tensor:
        calls.append((x.shape[0], b is not None))
        return real(x, w, b)

    monkeypatch.setattr(triton_ops, "dense_gemv", recording)
    return calls


def test_triton_ops_linear_runs_what_was_chosen(gemv_calls: list[tuple[int, bool]]) -> None:
    ops = TritonOps()
    assert ops.linear_choices is not None
    w = _weight()
    bias = torch.randn(48).to(BF16)
    ops.linear_choices.decide((LINEAR, 48, 80, BF16, 2), default_s=2.0, gemv_s=1.0)
    ops.linear_choices.decide((LINEAR, 48, 80, BF16, 3), default_s=1.0, gemv_s=2.0)
    for m in (2, 3, 20):
        x = torch.randn(m, 80).to(BF16)
        for b in (None, bias):
            torch.testing.assert_close(ops.linear(x, w, b), F.linear(x, w, b),
                                       atol=2e-2, rtol=2e-2)
    assert gemv_calls == [(2, False), (2, True)]  # M=3: cuBLAS was faster; M=20: above 16


def test_arguments_the_kernel_does_not_take_run_cublas(
        gemv_calls: list[tuple[int, bool]]) -> None:
    ops = TritonOps()
    assert ops.linear_choices is not None
    ops.linear_choices.decide((LINEAR, 48, 80, BF16, 2), default_s=2.0, gemv_s=1.0)
    strided = torch.randn(80, 2).to(BF16).t()  # [2, 80], not contiguous
    torch.testing.assert_close(ops.linear(strided, _weight()), F.linear(strided, _weight()))
    assert gemv_calls == []


def test_silu_mul_linear_fuses_where_chosen(monkeypatch: pytest.MonkeyPatch,
                                            gemv_calls: list[tuple[int, bool]]) -> None:
    """Fused where its own key says so (the unfused GEMV's bits); else silu_and_mul then the
    linear, which follows the linear's key."""
    fused: list[int] = []
    real_gemv = dense_gemv
    real = triton_ops.silu_mul_gemv
    monkeypatch.setattr(triton_ops, "silu_mul_gemv",
                        lambda gu, w: fused.append(gu.shape[0]) or real(gu, w))
    ops = TritonOps()
    assert ops.linear_choices is not None
    w = _weight()
    ops.linear_choices.decide((SILU_MUL, 48, 80, BF16, 2), default_s=2.0, gemv_s=1.0)
    ops.linear_choices.decide((SILU_MUL, 48, 80, BF16, 3), default_s=1.0, gemv_s=2.0)
    ops.linear_choices.decide((LINEAR, 48, 80, BF16, 3), default_s=2.0, gemv_s=1.0)
    for m in (2, 3, 20):
        gate_up = torch.randn(m, 160).to(BF16)
        out = ops.silu_mul_linear(gate_up, w)
        act = ops.silu_and_mul(gate_up)
        expected = real_gemv(act, w) if m == 2 else ops.linear(act, w)
        assert torch.equal(out, expected), m
    assert fused == [2]
    assert gemv_calls == [(3, False), (3, False)]  # M=3 unfused, and its reference


def _rows_of_calls(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """The row counts of every call the ops make to kernels.ops.<name>, which still runs."""
    rows: list[int] = []
    real = getattr(triton_ops, name)

    def recording(x: torch.Tensor, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        rows.append(x.shape[0])
        return real(x, *args)

    monkeypatch.setattr(triton_ops, name, recording)
    return rows


def test_norm_linear_fuses_the_norm_where_its_own_key_says_so(
        monkeypatch: pytest.MonkeyPatch, gemv_calls: list[tuple[int, bool]]) -> None:
    """Rows whose norm-fused GEMV the warmup timed faster than the two ops: norm_gemv, one
    launch, whatever the linear alone's key says. Else, or above 16 rows: rms_norm, then the
    linear as its own key says."""
    fused = _rows_of_calls(monkeypatch, "norm_gemv")
    ops = TritonOps()
    assert ops.linear_choices is not None
    w, norm_w = _weight(), torch.randn(80).to(BF16)
    ops.linear_choices.decide((NORM, 48, 80, BF16, 1), default_s=2.0, gemv_s=1.0)
    ops.linear_choices.decide((LINEAR, 48, 80, BF16, 1), default_s=1.0, gemv_s=2.0)
    # 2 rows: the GEMV wins alone, not with the norm in its loads (the 8B's gate/up at 8
    # rows on an H100): the norm, then the GEMV.
    ops.linear_choices.decide((NORM, 48, 80, BF16, 2), default_s=1.0, gemv_s=2.0)
    ops.linear_choices.decide((LINEAR, 48, 80, BF16, 2), default_s=2.0, gemv_s=1.0)
    ops.linear_choices.decide((NORM, 48, 80, BF16, 3), default_s=1.0, gemv_s=2.0)
    ops.linear_choices.decide((LINEAR, 48, 80, BF16, 3), default_s=1.0, gemv_s=2.0)
    for m in (1, 2, 3, 20):
        x, residual = torch.randn(m, 80).to(BF16), torch.randn(m, 80).to(BF16)
        out, new_residual = ops.norm_linear(x, residual, norm_w, 1e-6, w)
        normed, want_residual = ops.rms_norm(x, norm_w, 1e-6, residual)
        assert torch.equal(new_residual, want_residual)
        torch.testing.assert_close(out, F.linear(normed, w), atol=2e-2, rtol=2e-2)
    assert fused == [1] and gemv_calls == [(2, False)]  # 3: cuBLAS both ways; 20: above 16
    cublas = TritonOps()
    assert cublas.linear_choices is not None
    cublas.linear_choices.decide((NORM, 48, 80, BF16, 1), default_s=1.0, gemv_s=2.0)
    cublas.linear_choices.decide((LINEAR, 48, 80, BF16, 1), default_s=2.0, gemv_s=1.0)
    cublas.norm_linear(torch.randn(1, 80).to(BF16), None, norm_w, 1e-6, w)
    assert fused == [1] and gemv_calls == [(2, False), (1, False)]


def test_norm_mlp_fuses_norm_and_activation_where_the_down_projection_does_not_take_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows whose NORM_ACT key says the fused launch and whose SILU_MUL key leaves the
    activation out of the down projection: norm_act_gemv, then the down projection on its
    output. Where the down projection takes the activation (one launch saved either way), where
    the key says the unfused path, and above 16 rows: norm_linear then silu_mul_linear."""
    fused = _rows_of_calls(monkeypatch, "norm_act_gemv")
    ops = TritonOps()
    choices = ops.linear_choices
    assert choices is not None
    gate_up, down, norm_w = _weight(48, 80), _weight(80, 24), torch.randn(80).to(BF16)
    for m, act_fused, down_takes_act in ((1, True, False), (2, True, True), (3, False, False)):
        choices.decide((NORM_ACT, 48, 80, BF16, m), 2.0, 1.0 if act_fused else 3.0)
        choices.decide((SILU_MUL, 80, 24, BF16, m), 2.0, 1.0 if down_takes_act else 3.0)
    for m in (1, 2, 3, 20):
        x, residual = torch.randn(m, 80).to(BF16), torch.randn(m, 80).to(BF16)
        out, new_residual = ops.norm_mlp(x, residual, norm_w, 1e-6, gate_up, down)
        up, want_residual = ops.norm_linear(x, residual, norm_w, 1e-6, gate_up)
        assert torch.equal(new_residual, want_residual)
        if m == 1:  # norm_gemv's product, then silu_and_mul, to the bit
            up = triton_ops.norm_gemv(x, residual, norm_w, 1e-6, gate_up)[0]
            assert torch.equal(out, ops.linear(ops.silu_and_mul(up), down))
        else:
            assert torch.equal(out, ops.silu_mul_linear(up, down)), m
    assert fused == [1]
    # A gate/up weight the launch cannot take was never timed for it: no lookup, no miss.
    choices.filled = True
    for op, n, k in ((SILU_MUL, 80, 24), (NORM, 48, 80), (LINEAR, 48, 80), (LINEAR, 80, 24)):
        choices.decide((op, n, k, BF16, 4), 1.0, 2.0)
    monkeypatch.setattr(triton_ops, "norm_act_applies", lambda *args: False)
    x = torch.randn(4, 80).to(BF16)
    ops.norm_mlp(x, x, norm_w, 1e-6, gate_up, down)
    assert choices.misses == 0 and fused == [1]


def test_the_batch_invariant_ops_have_no_choices() -> None:
    """--deterministic's linear is its own (kernels.invariant_ops): nothing to time for it,
    and its fused MLP call is its activation then its own linear."""
    ops = BatchInvariantOps()
    assert ops.linear_choices is None
    gate_up, w = torch.randn(3, 32), torch.randn(16, 16)
    assert torch.equal(ops.silu_mul_linear(gate_up, w), ops.linear(ops.silu_and_mul(gate_up), w))
