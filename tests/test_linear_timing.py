"""The warmup's timer of cuBLAS against the Triton GEMV (runner.linear_timing), with the CUDA
calls faked on the CPU: a fake clock advances by each candidate's cost per call and the events
read it.

- Each candidate's first call (its compile, cuBLAS's algorithm choice) is not timed, and each
  keeps its median round: a slow outlier round does not decide.
- Every timed call takes the next layer's weight, across rounds and candidates, so a weight is
  read again only after every other weight of the shape (a decode step's cold reads).
- A GEMV launch that does not fit the GPU is infinitely slow, never an error.
- SiLU-and-mul fused into the down projection is weighed against the activation then the
  faster of the two linears, and the RMSNorm fused into a projection against the norm then
  the faster of the two."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

from triton.runtime.errors import OutOfResources

from warmgate.server.kernels import activation
from warmgate.server.kernels import dense_gemv as dense_gemv_module
from warmgate.server.kernels.linear_choices import LINEAR, NORM, NORM_ACT, SILU_MUL
from warmgate.server.runner import linear_timing

# The modules, not the functions the package exports under the same names.
norm_gemv_module = importlib.import_module("warmgate.server.kernels.norm_gemv")
rms_norm_module = importlib.import_module("warmgate.server.kernels.rms_norm")


class FakeGpu:
    """A clock in ms that the fake kernels advance; the weights each call read, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cublas_us: float, gemv_us: float,
                 slow_round: int | None = None, fused_us: float = 0.0,
                 silu_us: float = 0.0, norm_us: float = 0.0, act_us: float = 0.0) -> None:
        self.now_ms = 0.0
        self.reads: list[tuple[str, int]] = []  # (candidate, weight id)
        self.cublas_us, self.gemv_us = cublas_us, gemv_us
        self.fused_us, self.silu_us, self.norm_us = fused_us, silu_us, norm_us
        self.act_us = act_us
        self.slow_round = slow_round  # this cuBLAS round (0-based, timed ones) is 10x slower
        self.cublas_rounds = -1
        self.gemv_fits = True
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.at = 0.0

            def record(self) -> None:
                self.at = gpu.now_ms

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, end: Event) -> float:
                return end.at - self.at

        def sleep(cycles: int) -> None:
            gpu.now_ms += 1.0  # a round starts: the sleep before it is not timed
            gpu.round_started = True

        @contextlib.contextmanager
        def device(_: Any) -> Iterator[None]:
            yield

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "_sleep", sleep)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *_: None)
        monkeypatch.setattr(torch.cuda, "device", device)
        monkeypatch.setattr(linear_timing.F, "linear", self.cublas)
        monkeypatch.setattr(dense_gemv_module, "dense_gemv", self.gemv)
        monkeypatch.setattr(dense_gemv_module, "silu_mul_gemv", self.fused)
        monkeypatch.setattr(activation, "silu_and_mul", self.silu)
        monkeypatch.setattr(rms_norm_module, "rms_norm", self.norm)
        monkeypatch.setattr(norm_gemv_module, "norm_gemv", self.norm_fused)
        monkeypatch.setattr(norm_gemv_module, "norm_act_gemv", self.act_fused)
        self.round_started = False

    def cublas(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.round_started:
            self.cublas_rounds += 1
            self.round_started = False
        slow = 10.0 if self.cublas_rounds == self.slow_round else 1.0
        self.now_ms += self.cublas_us * slow / 1e3
        self.reads.append(("cublas", id(w)))
        return x

    def silu(self, gate_up: torch.Tensor) -> torch.Tensor:
        self.now_ms += self.silu_us / 1e3
        return gate_up[:, :gate_up.shape[1] // 2]

    def norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        assert residual is not None and residual.shape == x.shape == (x.shape[0], 80)
        assert weight.shape == (80,)  # the weights' K
        self.now_ms += self.norm_us / 1e3
        return x, residual

    def norm_fused(self, x: torch.Tensor, residual: torch.Tensor | None,
                   weight: torch.Tensor, eps: float, w: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        assert residual is not None  # timed as the layers past the first run it
        self.round_started = False
        self.now_ms += self.fused_us / 1e3
        self.reads.append(("fused", id(w)))
        return x, residual

    def act_fused(self, x: torch.Tensor, residual: torch.Tensor | None,
                  weight: torch.Tensor, eps: float, w: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        assert residual is not None
        self.round_started = False
        self.now_ms += self.act_us / 1e3
        self.reads.append(("act", id(w)))
        return x, residual

    def fused(self, gate_up: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        self.round_started = False
        self.now_ms += self.fused_us / 1e3
        self.reads.append(("fused", id(w)))
        return gate_up

    def gemv(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if not self.gemv_fits:
            raise OutOfResources(300000, 232448, "shared memory")
        self.round_started = False
        self.now_ms += self.gemv_us / 1e3
        self.reads.append(("gemv", id(w)))
        return x


def _weights(count: int) -> list[torch.Tensor]:
    return [torch.zeros(48, 80) for _ in range(count)]


def test_the_median_round_per_call_of_each_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(monkeypatch, cublas_us=30.0, gemv_us=20.0, slow_round=1)
    cublas_s, gemv_s = linear_timing.time_linears(_weights(5), 4, LINEAR)
    assert cublas_s == pytest.approx(30e-6) and gemv_s == pytest.approx(20e-6)
    timed = len(gpu.reads) - 2
    assert timed == 2 * linear_timing.ROUNDS * linear_timing.CALLS_PER_ROUND


def test_every_call_takes_the_next_weight_across_rounds_and_candidates(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(monkeypatch, cublas_us=30.0, gemv_us=20.0)
    weights = _weights(5)
    linear_timing.time_linears(weights, 1, LINEAR)
    ids = [w for _, w in gpu.reads[2:]]  # after the two untimed first calls
    order = [id(w) for w in weights]
    assert ids == [order[i % len(order)] for i in range(len(ids))]
    assert {c for c, _ in gpu.reads[2:2 + linear_timing.CALLS_PER_ROUND]} == {"cublas"}


def test_a_gemv_that_does_not_fit_is_never_the_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGpu(monkeypatch, cublas_us=30.0, gemv_us=1.0)
    gpu.gemv_fits = False
    cublas_s, gemv_s = linear_timing.time_linears(_weights(3), 2, LINEAR)
    assert cublas_s == pytest.approx(30e-6) and gemv_s == float("inf")
    assert {c for c, _ in gpu.reads} == {"cublas"}


def test_fused_silu_mul_against_the_activation_then_the_better_linear(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The default of the fused op is SiLU-and-mul then whichever linear is faster."""
    gpu = FakeGpu(monkeypatch, cublas_us=30.0, gemv_us=20.0, fused_us=21.0, silu_us=3.0)
    default_s, fused_s = linear_timing.time_linears(_weights(4), 8, SILU_MUL)
    assert default_s == pytest.approx(23e-6) and fused_s == pytest.approx(21e-6)
    assert {c for c, _ in gpu.reads} == {"cublas", "gemv", "fused"}


def test_fused_norm_against_the_norm_then_the_better_linear(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The norm-fused GEMV is timed as itself, not read off the plain GEMV's time: here the
    plain GEMV beats cuBLAS and the fused one loses to the norm then that GEMV."""
    gpu = FakeGpu(monkeypatch, cublas_us=30.0, gemv_us=20.0, fused_us=26.0, norm_us=3.0)
    default_s, fused_s = linear_timing.time_linears(_weights(4), 8, NORM)
    assert default_s == pytest.approx(23e-6) and fused_s == pytest.approx(26e-6)
    assert {c for c, _ in gpu.reads} == {"cublas", "gemv", "fused"}


def test_norm_and_act_fused_against_the_best_norm_path_then_the_activation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """gate/up's one launch against each of NORM's three candidates followed by the
    activation's launch: the norm-fused GEMV then SiLU-and-mul is the best of those here."""
    gpu = FakeGpu(monkeypatch, cublas_us=30.0, gemv_us=20.0, fused_us=19.0, norm_us=3.0,
                  silu_us=2.0, act_us=20.5)
    default_s, act_s = linear_timing.time_linears(_weights(4), 8, NORM_ACT)
    assert default_s == pytest.approx(21e-6) and act_s == pytest.approx(20.5e-6)
    assert {c for c, _ in gpu.reads} == {"cublas", "gemv", "fused", "act"}
