"""Fills the ops' linear choices (kernels/linear_choices.py) before the CUDA graphs are
captured: for every dense weight shape, at every row count <= max_m a forward can run it at,
cuBLAS and the Triton GEMV are timed on the device (runner/linear_timing.py) and the faster is
kept; for the MLP's down projection also SiLU-and-mul then its linear against the GEMV with
the activation fused in, and for the QKV and gate/up projections the RMSNorm then the linear
against the GEMV with the norm fused in. The warmup plan calls `choose_linears` just before
the capture, once the dense-GEMM sweep has left the GPU to it (warmup/graphs_phase.py);
ModelRunner.capture_cuda_graphs calls it again (a no-op then), so a tensor-parallel worker,
which is sent the capture alone, fills its own.
The GEMV's binaries are compiled ahead, on the dense-GEMM sweep's thread (compile_gemvs).

The row counts (runner/eager_tokens.py): the decoder layers' projections run at every uniform
decode's count (requests x decode length, graphs or not), at each eager count and each ragged
graph's token bucket; the head at 1..the most logits rows of a step. A torch.compile'd forward
runs the layers through torch ops (runner/compiled_forward.py), so then only the head is timed.

Everything the timing runs (both candidates at every planned row count) is compiled or loaded
here, before ready; after it nothing is timed: a (shape, M) not planned here runs cuBLAS.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from warmgate.server.config.runner_config import RunnerConfig
    from warmgate.server.kernels.linear_choices import Key, LinearChoices, LinearTimer
    from warmgate.server.runner.model import LlamaModel

logger = logging.getLogger(__name__)

# [(op, every weight of one (shape, dtype), the row counts to time it at, ascending)]
LinearPlan = list[tuple[str, list[torch.Tensor], list[int]]]
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
# The projections a layer runs through ops.norm_linear (their RMSNorm may be fused in).
NORM_FUSED = ("qkv_proj", "gate_up_proj")


class TuningRunner(Protocol):
    """What these functions read off a runner (ModelRunner, and the warmup's WarmupRunner)."""

    config: RunnerConfig
    device: torch.device
    model: LlamaModel
    decode_query_len: int
    max_num_reqs: int
    max_num_tokens: int
    is_pooling_model: bool
    compile_buckets: tuple[int, ...]

    def eager_token_counts(self) -> list[int]: ...

    def ragged_graph_buckets(self) -> tuple[int, ...]: ...


def linear_choices_of(runner: TuningRunner) -> LinearChoices | None:
    """The choices this runner's linears consult (TritonOps': a subclass with a linear of its
    own, the batch-invariant ops of --deterministic, has none), unless --no-dense-gemv."""
    if not runner.config.compilation.dense_gemv:
        return None
    return getattr(runner.model.ops, "linear_choices", None)


def _layer_weights(model: LlamaModel, names: tuple[str, ...]) -> list[list[torch.Tensor]]:
    """The named projections' weights that run through the ops (an FP8 one has a scale and
    runs runner.fp8_linear), grouped by (shape, dtype), every layer's in each group."""
    groups: dict[tuple[tuple[int, ...], torch.dtype], list[torch.Tensor]] = {}
    for layer in model.layers:
        for name in names:
            weight = getattr(layer, name, None)
            if weight is not None and getattr(layer, name + "_scale", None) is None:
                groups.setdefault((tuple(weight.shape), weight.dtype), []).append(weight)
    return list(groups.values())


def linear_plan(runner: TuningRunner, max_m: int) -> LinearPlan:
    """Every (op, shape's weights, row counts <= max_m) the ops can meet after ready: each
    projection's linear, the down projection's SiLU-and-mul fused in too (ops.silu_mul_linear),
    the QKV and gate/up projections' RMSNorm (ops.norm_linear), and gate/up's RMSNorm and
    SiLU-and-mul both (ops.norm_mlp) where that launch takes the weight; a linear alone is
    what runs where its fused op is not chosen, and what the GEMM sweep runs."""
    from warmgate.server.kernels.linear_choices import (  # the ops imported it
        LINEAR,
        NORM,
        NORM_ACT,
        SILU_MUL,
    )

    plan: LinearPlan = []
    model = runner.model
    budget = min(max_m, runner.max_num_tokens)
    q = runner.decode_query_len
    if not runner.compile_buckets:
        counts = set(runner.eager_token_counts()) | set(runner.ragged_graph_buckets())
        counts |= {n * q for n in range(1, runner.max_num_reqs + 1)}
        ms = sorted(c for c in counts if 1 <= c <= budget)
        plan += [(LINEAR, ws, ms) for ws in _layer_weights(model, PROJECTIONS)] if ms else []
        plan += [(SILU_MUL, ws, ms) for ws in _layer_weights(model, ("down_proj",))] if ms else []
        plan += [(NORM, ws, ms) for ws in _layer_weights(model, NORM_FUSED)] if ms else []
        plan += [(NORM_ACT, ws, ms) for ws in _layer_weights(model, ("gate_up_proj",))
                 if ms and _act_fuses(ws[0], ms)]
    if not runner.is_pooling_model:
        head = model.embed_tokens if model.lm_head is None else model.lm_head
        rows = min(budget, runner.max_num_reqs * q)
        plan.append((LINEAR, [head], list(range(1, rows + 1))))
    return plan


def _act_fuses(gate_up: torch.Tensor, ms: list[int]) -> bool:
    """Whether norm_act_gemv takes this gate/up weight at every row count of ms: its launch
    must leave K in one range (a weight of an odd row count or a narrow one it refuses)."""
    from warmgate.server.kernels.gemv_plan import rows_bucket
    from warmgate.server.kernels.norm_gemv import norm_act_applies

    norm_weight = gate_up.new_empty(gate_up.shape[1])
    return all(norm_act_applies(x, x, norm_weight, gate_up)
               for x in {rows_bucket(m): gate_up.new_empty(m, gate_up.shape[1])
                         for m in ms}.values())


def planned_keys(runner: TuningRunner, max_m: int) -> list[Key]:
    """Every (op, N, K, dtype, M) of linear_plan."""
    return [(op, w[0].shape[0], w[0].shape[1], w[0].dtype, m)
            for op, w, ms in linear_plan(runner, max_m) for m in ms]


def compile_gemvs(runner: TuningRunner) -> int:
    """Run the GEMV once per (planned op, shape, row bucket) on the current stream, so its
    binaries are compiled before choose_linears times them: the dense-GEMM sweep calls this
    on its own thread, beside the load and the phases (warmup/gemm_shapes.py). Returns the
    calls (0 where nothing will be timed: no GEMV ops, --no-dense-gemv, not CUDA)."""
    choices = linear_choices_of(runner)
    if choices is None or runner.device.type != "cuda":
        return 0
    return _run_gemv_once(linear_plan(runner, choices.max_m), lambda key: True)


def _run_gemv_once(plan: LinearPlan, wanted: Callable[[Key], bool]) -> int:
    """The Triton kernel of each wanted key once per (op, shape, row bucket) (CUDA only);
    norm_gemv with a residual and without (layer 0's QKV), a binary each."""
    from triton.runtime.errors import OutOfResources  # imports triton

    from warmgate.server.kernels.dense_gemv import dense_gemv, silu_mul_gemv
    from warmgate.server.kernels.gemv_plan import rows_bucket
    from warmgate.server.kernels.linear_choices import LINEAR, NORM, NORM_ACT, SILU_MUL
    from warmgate.server.kernels.norm_gemv import norm_act_gemv, norm_gemv
    from warmgate.server.runner.linear_timing import NORM_EPS

    calls = 0
    for op, weights, ms in plan:
        w = weights[0]
        n, k = w.shape
        for m in {rows_bucket(m): m for m in ms if wanted((op, n, k, w.dtype, m))}.values():
            x = torch.zeros(m, 2 * k if op == SILU_MUL else k, dtype=w.dtype, device=w.device)
            runs: list[tuple[Callable[..., object], tuple[object, ...]]] = (
                [(norm_gemv, (x, x, x[0], NORM_EPS, w)),
                 (norm_gemv, (x, None, x[0], NORM_EPS, w))]
                if op == NORM else
                [(norm_act_gemv, (x, x, x[0], NORM_EPS, w))] if op == NORM_ACT else
                [(dense_gemv if op == LINEAR else silu_mul_gemv, (x, w))])
            for fn, args in runs:
                try:
                    fn(*args)
                except OutOfResources:  # the timing finds it so too, and keeps the default
                    break
                calls += 1
    return calls


def linear_timer(runner: TuningRunner, choices: LinearChoices) -> LinearTimer | None:
    """What choose_linears times with: the attached one, or on CUDA the events' (attached
    now); None on a CPU without one."""
    if choices.timer is None and runner.device.type == "cuda":
        from warmgate.server.runner.linear_timing import time_linears

        choices.timer = time_linears
    return choices.timer


def choose_linears(runner: TuningRunner) -> dict[str, object]:
    """Time and decide every planned (shape, M) not decided yet; {} when this runner has no
    choices to make (no GEMV ops, --no-dense-gemv, nothing to time with: not CUDA). On CUDA
    a pair decided earlier (the compile cache entry's) for the GEMV runs it once, so its
    binary is loaded before ready too."""
    choices = linear_choices_of(runner)
    timer = None if choices is None else linear_timer(runner, choices)
    if choices is None or timer is None:
        return {}
    from warmgate.server.kernels.linear_choices import key_name  # the ops imported it

    start = time.perf_counter()
    plan = linear_plan(runner, choices.max_m)
    timed: set[Key] = set()
    for op, weights, ms in plan:
        n, k = weights[0].shape
        for m in ms:
            key = (op, n, k, weights[0].dtype, m)
            if not choices.decided(key):
                choices.decide(key, *timer(weights, m, op))
                timed.add(key)
    choices.filled = True
    gemv = set(choices.gemv_keys())
    if runner.device.type == "cuda":
        _run_gemv_once(plan, lambda key: key in gemv and key not in timed)
    seconds = time.perf_counter() - start
    if timed:
        logger.info("dense linears: timed %d (shape, M) in %.3f s over %d shapes; the Triton "
                    "GEMV runs %d of them", len(timed), seconds, len(plan), len(gemv))
    return {"timed": len(timed), "seconds": round(seconds, 4), "shapes": len(plan),
            "gemv": sorted(key_name(key) for key in gemv)}
