"""The warmup fills the dense linears' choices (runner.linear_tuning) before the CUDA graphs.

- The plan: every projection shape at every row count <= 16 a forward can run it at after
  ready (each uniform decode, eager count and ragged bucket, as a CUDA runner computes them),
  every layer's weight of the shape handed to the timer; the head at 1..its logits rows.
- The GEMV's binaries compile on the dense-GEMM sweep, one per shape and row bucket.
- Each (shape, M) is timed once; afterwards nothing is timed: a second fill, the capture and
  the serving steps only look up, and the steps meet no miss.
- The GEMV's results in a served model equal the torch reference's (Qwen2's q/k/v bias too),
  the down projection's with SiLU-and-mul fused in as well.
- The plan's cuda_graphs step has filled them when the capture starts, whether graphs are
  captured or not; a tensor-parallel worker's capture fills its own first.
- Nothing is timed under --no-dense-gemv, --deterministic, or on a CPU without a timer.

CPU only: a fake timer stands in for the CUDA events, the Triton interpreter for the GPU."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

from tests.runner_helpers import full_prefill_logits, prompt, tiny_config
from tests.serving_helpers import Served, greedy
from warmgate.server.config.runner_config import RunnerConfig
from warmgate.server.core.results import PhaseResult, PhaseStatus
from warmgate.server.kernels import dense_gemv as dense_gemv_module
from warmgate.server.kernels import norm_gemv as norm_gemv_module
from warmgate.server.kernels import ops as triton_ops
from warmgate.server.kernels.gemv_plan import rows_bucket
from warmgate.server.kernels.invariant_ops import BatchInvariantOps
from warmgate.server.kernels.linear_choices import LINEAR, NORM, NORM_ACT, SILU_MUL, LinearChoices
from warmgate.server.kernels.ops import TritonOps
from warmgate.server.runner import model_runner
from warmgate.server.runner.linear_tuning import choose_linears, linear_plan
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.runner_settings import RunnerSettings
from warmgate.server.warmup import gemm_shapes, graphs_phase, plan


class FakeTimer:
    """Records (op, N, K, M, how many weights) per call; the Triton kernel wins where
    `gemv_wins` says."""

    def __init__(self, gemv_wins: bool = True) -> None:
        self.calls: list[tuple[str, int, int, int, int]] = []
        self.gemv_wins = gemv_wins

    def __call__(self, weights: Sequence[torch.Tensor], m: int, op: str
                 ) -> tuple[float, float]:
        n, k = weights[0].shape
        self.calls.append((op, n, k, m, len(weights)))
        return (2e-6, 1e-6) if self.gemv_wins else (1e-6, 2e-6)


def _runner(config: RunnerConfig | None = None, timer: FakeTimer | None = None,
            **kw: Any) -> ModelRunner:
    runner = ModelRunner(config or tiny_config(**kw), ops=TritonOps())  # type: ignore[arg-type]
    _choices(runner).timer = timer
    return runner


def _choices(runner: ModelRunner) -> LinearChoices:
    choices = getattr(runner.model.ops, "linear_choices", None)
    assert isinstance(choices, LinearChoices)
    return choices


def _cuda_settings(compilation: dict[str, Any] | None = None, **kw: Any) -> Any:
    """A CUDA runner's settings (runner.runner_settings) over the same model on the CPU."""
    config = tiny_config(device="cuda", attention_backend="triton", **kw)
    settings: Any = RunnerSettings()
    settings._read_config(dataclasses.replace(config, compilation=dataclasses.replace(
        config.compilation, **(compilation or {}))))
    settings.model = _runner(**kw).model
    return settings


LAYER_MS = {
    # k = 3, 4 requests: decodes of 4, 8, 12, 16 tokens (the ragged buckets 4, 8, 16 too).
    "drafts": ({"num_spec": 3, "max_num_seqs": 4}, {}, [4, 8, 12, 16]),
    # 4 requests: decodes of 1..4, the ragged graphs' token buckets 1, 2, 4, 8, 16.
    "ragged buckets": ({"max_num_seqs": 4}, {}, [1, 2, 3, 4, 8, 16]),
    # No ragged graphs: the decodes, and eager batches padded to 16 tokens.
    "eager": ({"max_num_seqs": 12}, {"ragged_cuda_graphs": False}, [*range(1, 13), 16]),
    # torch.compile: the layers run torch ops in the compiled forward; only the head is timed.
    "compiled": ({"max_num_seqs": 4}, {"compile": True}, None),
}


@pytest.mark.parametrize("case", LAYER_MS)
def test_the_plan_holds_every_row_count_a_cuda_forward_can_run(case: str) -> None:
    kw, compilation, layer_ms = LAYER_MS[case]
    settings = _cuda_settings(compilation, **kw)
    model = settings.model
    found = {(op, tuple(ws[0].shape), len(ws)): ms
             for op, ws, ms in linear_plan(settings, 16)}
    head = model.embed_tokens if model.lm_head is None else model.lm_head
    layer = model.layers[0]
    expected = {} if layer_ms is None else {
        (LINEAR, tuple(getattr(layer, name).shape), len(model.layers)): layer_ms
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")}
    if layer_ms is not None:  # the fused ops too: SiLU-and-mul into down, the norms in front
        expected[(SILU_MUL, tuple(layer.down_proj.shape), len(model.layers))] = layer_ms
        for name in ("qkv_proj", "gate_up_proj"):
            expected[(NORM, tuple(getattr(layer, name).shape), len(model.layers))] = layer_ms
        # and gate/up's norm and activation both
        expected[(NORM_ACT, tuple(layer.gate_up_proj.shape), len(model.layers))] = layer_ms
    rows = settings.max_num_reqs * settings.decode_query_len  # every logits row count
    expected[(LINEAR, tuple(head.shape), 1)] = list(range(1, min(rows, 16) + 1))
    assert found == expected


def test_the_gemm_sweep_compiles_the_gemv_once_per_shape_and_row_bucket(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """So the cuda_graphs phase's timing finds every binary compiled (on CUDA the sweep runs
    on its own thread, beside the load and the phases)."""
    runner = _runner(num_spec=3, max_num_seqs=4)
    monkeypatch.setattr(runner, "device", torch.device("cuda"))  # the plan a GPU would have
    ran: list[tuple[str, tuple[int, ...], int]] = []
    for op, name in ((LINEAR, "dense_gemv"), (SILU_MUL, "silu_mul_gemv")):
        monkeypatch.setattr(dense_gemv_module, name, lambda x, w, op=op: ran.append(
            (op, tuple(w.shape), rows_bucket(x.shape[0]))))
    normed: list[tuple[tuple[int, ...], bool]] = []
    monkeypatch.setattr(norm_gemv_module, "norm_gemv", lambda x, r, nw, eps, w: normed.append(
        (tuple(w.shape), r is not None)))
    monkeypatch.setattr(norm_gemv_module, "norm_act_gemv", lambda x, r, nw, eps, w: ran.append(
        (NORM_ACT, tuple(w.shape), rows_bucket(x.shape[0]))))
    gemm_shapes.sweep_gemm_shapes(runner, plan=[])
    expected = {(op, tuple(ws[0].shape), rows_bucket(m))
                for op, ws, ms in linear_plan(runner, 16) if op != NORM for m in ms}
    assert sorted(ran) == sorted(expected)  # each once
    # 4 projections, the fused down, gate/up with its norm and activation, the head
    assert len({(op, shape) for op, shape, _ in ran}) == 7
    # The QKV and gate/up projections run with their norm fused in: with a residual, and
    # without (layer 0's QKV), each a binary of its own per row bucket.
    layer = runner.model.layers[0]
    assert sorted(normed) == sorted((tuple(w.shape), r) for w in (layer.qkv_proj,
                                                                   layer.gate_up_proj)
                                    for r in (True, False) for _bucket in (1, 16))


def test_each_key_is_timed_once_and_never_again() -> None:
    timer = FakeTimer()
    runner = _runner(timer=timer, num_spec=3, max_num_seqs=4)
    info = choose_linears(runner)
    keys = {call[:4] for call in timer.calls}
    planned = sum(len(ms) for _, _, ms in linear_plan(runner, 16))
    assert len(timer.calls) == len(keys) == planned == info["timed"]
    assert all(count == len(runner.model.layers) for _, n, _, _, count in timer.calls
               if n != runner.config.model.vocab_size)  # every layer's weight, for cold reads
    assert _choices(runner).filled
    assert choose_linears(runner)["timed"] == 0 and len(timer.calls) == planned


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_served_steps_run_the_chosen_gemv_and_match_torch(
        monkeypatch: pytest.MonkeyPatch, architecture: str) -> None:
    # One layer: every projection, the fused down projection and the head still run the
    # GEMV; a second layer ran the same shapes again.
    config = tiny_config(max_num_seqs=2, max_model_len=64, num_blocks=40,
                         architecture=architecture, num_layers=1)
    reference, runner = ModelRunner(config), _runner(config, FakeTimer(gemv_wins=True))
    choose_linears(runner)

    def never(*_: Any) -> tuple[float, float]:
        raise AssertionError("timed after the warmup")

    _choices(runner).timer = never
    rows: list[int] = []
    fused: list[int] = []
    normed: list[int] = []
    real, real_fused, real_normed = (triton_ops.dense_gemv, triton_ops.silu_mul_gemv,
                                     triton_ops.norm_gemv)
    monkeypatch.setattr(triton_ops, "dense_gemv",
                        lambda x, w, b=None: rows.append(x.shape[0]) or real(x, w, b))
    monkeypatch.setattr(triton_ops, "silu_mul_gemv",
                        lambda gu, w: fused.append(gu.shape[0]) or real_fused(gu, w))
    monkeypatch.setattr(triton_ops, "norm_gemv", lambda x, *a: normed.append(x.shape[0])
                        or real_normed(x, *a))
    short = prompt(7, offset=5)
    torch.testing.assert_close(full_prefill_logits(runner, short),
                               full_prefill_logits(reference, short), atol=1e-4, rtol=1e-4)
    outputs = []
    for r in (reference, runner):
        served = Served(r)  # two prompts, then decodes of 2 and 1 requests
        reqs = [served.submit("a", prompt(20, offset=3), greedy(5)),
                served.submit("b", short, greedy(3))]
        served.run()
        outputs.append([q.output_token_ids for q in reqs])
    assert outputs[0] == outputs[1]
    assert {1, 2, 7} <= set(rows)  # decodes of one and two requests, the short prefill
    assert {1, 2, 7} <= set(fused)  # the MLP's down projection, SiLU-and-mul fused in
    # The QKV and gate/up projections with their norms fused in, wherever the GEMV runs them.
    assert {1, 2, 7} <= set(normed)
    assert _choices(runner).misses == 0


def test_the_plan_has_filled_them_when_the_capture_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    timer = FakeTimer(gemv_wins=False)  # cuBLAS everywhere: the warmup's forwards stay fast
    runner = _runner(timer=timer, max_num_seqs=2, max_num_batched_tokens=32)
    at_capture: list[int] = []
    capture = graphs_phase.cuda_graphs_phase

    def recording(r: Any, force: bool) -> PhaseResult:
        at_capture.append(len(_choices(runner).decisions))
        return capture(r, force)  # skipped on the CPU: the choices are made anyway

    monkeypatch.setattr(graphs_phase, "cuda_graphs_phase", recording)
    report = plan.run_warmup_plan(runner)
    assert report.succeeded
    assert at_capture == [len(timer.calls)] and timer.calls
    graphs = report.phase("cuda_graphs")
    assert graphs.status is PhaseStatus.SKIPPED
    assert graphs.shapes["dense_linears"]["timed"] == len(timer.calls)


def test_a_workers_capture_fills_its_own_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor-parallel worker is sent the capture alone (distributed/runners.py)."""
    timer = FakeTimer()
    runner = _runner(timer=timer)
    filled_at_capture: list[bool] = []

    class Graphs:
        def __init__(self, *_: Any, **__: Any) -> None:
            pass

        def capture(self) -> dict[str, object]:
            filled_at_capture.append(_choices(runner).filled)
            return {}

    monkeypatch.setattr(model_runner, "CudaGraphRunner", Graphs)
    monkeypatch.setattr(runner, "device", torch.device("cuda"))
    runner.capture_cuda_graphs()
    assert filled_at_capture == [True] and timer.calls


def test_nothing_is_timed_where_there_is_no_choice_to_make() -> None:
    timer = FakeTimer()
    config = tiny_config()
    off = dataclasses.replace(config, compilation=dataclasses.replace(
        config.compilation, dense_gemv=False))
    assert choose_linears(_runner(off, timer)) == {}
    deterministic = ModelRunner(config, ops=BatchInvariantOps())  # type: ignore[arg-type]
    assert choose_linears(deterministic) == {}
    untimed = _runner(config, None)  # a CPU: no CUDA events to time with
    assert choose_linears(untimed) == {} and not _choices(untimed).filled
    assert timer.calls == []
