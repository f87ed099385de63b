"""Run every FP8 projection a forward can issue outside a CUDA graph, once, at every token
count it can have there (the FP8 counterpart of gemm_shapes, called from its sweep).

An FP8 projection is not one cuBLAS GEMM (runner.fp8_linear): a per-token activation
quantization then `torch._scaled_mm`, whose cuBLASLt algorithm is chosen per problem shape
like a dense GEMM's, or the block-scaled Triton GEMM, compiled per launch of its token-count
table and per weight shape. Either met for the first time after ready would stall that
batch, so each distinct weight runs at every eager token count here. (FP8 experts are the
compile phase's MoE sweep's, warmup/moe_phase.py: it runs a MoE layer, scales and all, at
the same counts.) On CUDA only: the CPU dequantizes.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from warmgate.server.runner.fp8_linear import fp8_linear
from warmgate.server.warmup.runner_contract import WarmupRunner

if TYPE_CHECKING:
    from warmgate.server.runner.model import LlamaModel

logger = logging.getLogger(__name__)

_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
# (weight, scale, static input scale or None)
_Projection = tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None"]


def fp8_projections(model: LlamaModel) -> list[_Projection]:
    """(weight, scale, input scale) of one projection per distinct shape of the decoder
    layers' FP8 projections."""
    seen: dict[tuple[tuple[int, ...], tuple[int, ...]], _Projection] = {}
    for layer in model.layers:
        for name in _PROJECTIONS:
            weight, scale = getattr(layer, name), getattr(layer, name + "_scale", None)
            if weight is not None and scale is not None:
                seen.setdefault((tuple(weight.shape), tuple(scale.shape)),
                                (weight, scale, getattr(layer, name + "_input_scale")))
    return list(seen.values())


@torch.inference_mode()
def sweep_fp8_gemms(model_runner: WarmupRunner) -> int:
    """Every FP8 projection at every eager token count. Returns the calls made (0 for a
    model without FP8 weights, or off CUDA)."""
    model = model_runner.model
    counts = model_runner.eager_token_counts()
    if model.config.fp8 is None or model_runner.device.type != "cuda" or not counts:
        return 0
    start = time.perf_counter()
    projections = fp8_projections(model)
    calls = 0
    for weight, scale, input_scale in projections:
        inputs = torch.zeros(counts[-1], weight.shape[1], device=model_runner.device,
                             dtype=model.dtype)
        for m in counts:
            fp8_linear(inputs[:m], weight, scale, input_scale)
        calls += len(counts)
    logger.info("shape sweeps: FP8 GEMMs: %d in %.3f s, %d projection shapes at %d token "
                "counts (%s scales)", calls, time.perf_counter() - start, len(projections),
                len(counts), model.config.fp8.scheme)
    return calls
