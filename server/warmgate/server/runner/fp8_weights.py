"""FP8 scale tensors under the checkpoints' names: where each lands in the fused model, and the
views the model-directory writer saves.

A checkpoint holds one scale per projection tensor (q, k, v, gate, up, down, each expert's);
the model fuses q/k/v and gate/up (runner.model, runner.moe) and so their scales:
- per-channel ([N, 1]) and block ([N/128, K/128]) scales are row slices of the fused scale,
  loaded in place like the weights;
- a per-tensor scale ([1] or []) becomes the value of its rows of the fused per-row scale
  (runner.fp8_linear), so q, k and v keep their own scales inside one matmul;
- static input scales ([1] or []) of the parts of one fused projection share one activation
  quantization, so the fused one takes their maximum (as vLLM does): no part's activations
  clip, at the cost of the finer scale of the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from warmgate.server.config.fp8_config import FP8_BLOCK, FP8Config
from warmgate.server.config.hf_moe import moe_weight_names
from warmgate.server.config.safetensors_header import TensorEntry
from warmgate.server.runner.model import LlamaModel


@dataclass(frozen=True)
class _Fused:
    scale: torch.Tensor  # the fused projection's scale (runner.fp8_linear's layout)
    input_scale: torch.Tensor | None  # [1]
    parts: tuple[tuple[str, int, int], ...]  # (checkpoint module, first row, end row)


def _split(prefix: str, names: tuple[str, ...], sizes: tuple[int, ...]
           ) -> tuple[tuple[str, int, int], ...]:
    out, start = [], 0
    for name, size in zip(names, sizes, strict=True):
        out.append((prefix + name, start, start + size))
        start += size
    return tuple(out)


def _fused(model: LlamaModel) -> list[_Fused]:
    cfg = model.config
    out: list[_Fused] = []
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        dense = [("qkv_proj", p + "self_attn.", ("q_proj", "k_proj", "v_proj"),
                  (layer.q_size, layer.kv_size, layer.kv_size)),
                 ("o_proj", p + "self_attn.", ("o_proj",), (cfg.hidden_size,))]
        if layer.moe is None:
            inter = cfg.intermediate_size
            dense += [("gate_up_proj", p + "mlp.", ("gate_proj", "up_proj"), (inter, inter)),
                      ("down_proj", p + "mlp.", ("down_proj",), (cfg.hidden_size,))]
        for attr, prefix, names, sizes in dense:
            scale = getattr(layer, attr + "_scale")
            out.append(_Fused(scale, getattr(layer, attr + "_input_scale"),
                              _split(prefix, names, sizes)))
        if layer.moe is not None:
            assert layer.moe.w13_scale is not None and layer.moe.w2_scale is not None
            inter = cfg.moe_intermediate_size
            _, experts = moe_weight_names(cfg.architecture, i, cfg.num_experts)
            for e, (gate, up, down) in enumerate(experts):
                out.append(_Fused(layer.moe.w13_scale[e], None, (
                    (gate.removesuffix(".weight"), 0, inter),
                    (up.removesuffix(".weight"), inter, 2 * inter))))
                out.append(_Fused(layer.moe.w2_scale[e], None, (
                    (down.removesuffix(".weight"), 0, cfg.hidden_size),)))
    return out


def _part_scale(fp8: FP8Config, scale: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """A view of the rows [start, end) of a fused scale in the checkpoint's shape."""
    if fp8.scheme == "block":
        return scale[start // FP8_BLOCK:-(-end // FP8_BLOCK)]
    if fp8.scheme == "channel":
        return scale[start:end].unsqueeze(1)
    return scale[start:start + 1].reshape(fp8.scale_shape(1, 1))


def describe(fp8: FP8Config) -> str:
    """One log line's worth: the weights' scales and how activations are quantized."""
    acts = ("static per tensor (the checkpoint's input_scale)" if fp8.static_input
            else "per token and 128-group" if fp8.scheme == "block" else "per token")
    kernel = ("Triton block GEMM" if fp8.scheme == "block" else "torch._scaled_mm")
    return (f"FP8 projections ({fp8.fmt}, {fp8.scheme} scales, activations {acts}; "
            f"{kernel} on CUDA, dequantized on the CPU)")


def fp8_scale_views(model: LlamaModel) -> dict[str, torch.Tensor]:
    """{checkpoint name: view} of every scale, as a writer saves them."""
    fp8 = model.config.fp8
    if fp8 is None:
        return {}
    out: dict[str, torch.Tensor] = {}
    for f in _fused(model):
        for module, start, end in f.parts:
            out[f"{module}.{fp8.scale_suffix}"] = _part_scale(fp8, f.scale, start, end)
            if f.input_scale is not None:
                out[module + ".input_scale"] = f.input_scale.reshape(fp8.scale_shape(1, 1))
    return out


def fp8_load_targets(model: LlamaModel, entries: dict[str, TensorEntry]
                     ) -> tuple[dict[str, torch.Tensor], Callable[[], None]]:
    """({checkpoint name: tensor to read it into}, a function that, once they are read, puts
    per-tensor and input scales in place). `entries`: the scales' header entries."""
    fp8 = model.config.fp8
    if fp8 is None:
        return {}, lambda: None
    targets: dict[str, torch.Tensor] = {}
    spreads: list[tuple[torch.Tensor, torch.Tensor]] = []  # (fused rows, the file's [1])
    maxima: list[tuple[torch.Tensor, list[torch.Tensor]]] = []  # (fused input, files')

    def temp(name: str) -> torch.Tensor:
        return torch.empty(entries[name].shape, dtype=torch.float32, device=model.device)

    for f in _fused(model):
        inputs: list[torch.Tensor] = []
        for module, start, end in f.parts:
            name = f"{module}.{fp8.scale_suffix}"
            if fp8.scheme == "tensor":
                targets[name] = temp(name)
                spreads.append((f.scale[start:end], targets[name]))
            else:
                targets[name] = _part_scale(fp8, f.scale, start, end)
            if f.input_scale is not None:
                targets[module + ".input_scale"] = temp(module + ".input_scale")
                inputs.append(targets[module + ".input_scale"])
        if f.input_scale is not None:
            maxima.append((f.input_scale, inputs))

    def finish() -> None:
        for rows, value in spreads:
            rows.copy_(value.reshape(1).expand(rows.shape[0]))
        for fused, values in maxima:
            fused.copy_(torch.stack([v.reshape(()) for v in values]).amax().reshape(1))

    return targets, finish
