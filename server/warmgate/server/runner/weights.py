"""Weights: seeded random init, and Hugging Face Llama directories (config.json + safetensors).

Kernel compilation depends on shapes and dtypes, not values, so random weights compile what
real ones would; a local HF directory gives real numbers when a test or a benchmark needs them.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import save_file

from warmgate.server.config.fp8_config import FP8_E4M3_MAX, FP8Config
from warmgate.server.config.hf_config import (
    ModelLoadError,
    hf_config_dict,
    model_config_from_hf,
    read_model_dir,
)
from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.config.weight_files import (
    MATCH_FIELDS,
    check_config_matches,
    index_weight_files,
    read_header,
)
from warmgate.server.config.weight_index import log_unlisted, weight_files
from warmgate.server.runner.fp8_linear import fill_fp8
from warmgate.server.runner.fp8_weights import describe, fp8_load_targets, fp8_scale_views
from warmgate.server.runner.model import LlamaModel
from warmgate.server.runner.moe_weights import init_moe, moe_hf_views
from warmgate.server.runner.weight_stream import stream_into

if TYPE_CHECKING:
    from warmgate.server.runner.tensor_parallel import TensorParallel

logger = logging.getLogger(__name__)

# One exception type for every model-load failure (config.json or tensors); the old name stays.
WeightsError = ModelLoadError
__all__ = ["MATCH_FIELDS", "ModelLoadError", "WeightsError", "check_config_matches",
           "hf_config_dict", "index_weight_files", "init_random_weights", "load_weights",
           "model_config_from_hf", "save_weights"]


def _normal(gen: torch.Generator, std: float, param: torch.Tensor, full_shape: tuple[int, ...],
            parts: list[tuple[str, int, torch.Tensor]], tp: TensorParallel | None,
            fp8: tuple[FP8Config, torch.Tensor | None] | None = None) -> None:
    """Fill param from gen. Under tensor parallel every rank draws the full-size tensor (the
    same numbers TP=1 draws) and keeps its shard of each HF-named part (name, full rows along
    dim 0, the local view it lands in), so a sharded model equals the unsharded one. An FP8
    param (fp8: its config and scale) gets the same draws quantized (never sharded)."""
    if fp8 is not None and fp8[1] is not None:
        fill_fp8(param, fp8[1], fp8[0], lambda t: t.normal_(0.0, std, generator=gen))
        return
    if tp is None:
        param.normal_(0.0, std, generator=gen)
        return
    full = torch.empty(full_shape, device=param.device, dtype=param.dtype)
    full.normal_(0.0, std, generator=gen)
    pieces = full.split([rows for _, rows, _ in parts])
    for (name, _, view), piece in zip(parts, pieces, strict=True):
        tp.copy_take(name, piece, view)


def _fp8(fp8: FP8Config | None, layer: torch.nn.Module, name: str
         ) -> tuple[FP8Config, torch.Tensor | None] | None:
    """(the model's FP8Config, the projection's scale), None for a served-dtype model. A
    static input scale gets 16 / 448: the activations (normalised, near unit scale) up to
    16 in magnitude keep their values."""
    if fp8 is None:
        return None
    input_scale = getattr(layer, name + "_input_scale")
    if input_scale is not None:
        input_scale.fill_(16.0 / FP8_E4M3_MAX)
    return fp8, getattr(layer, name + "_scale")


@torch.no_grad()
def init_random_weights(model: LlamaModel, seed: int) -> None:
    """Fill every parameter from one generator on the model's device (no host round trip).

    The same seed gives the same weights on the same device type (and, sharded, the same
    shards of them at any tensor-parallel size). Standard deviations keep activations near
    unit scale at any width: fan_in^-0.5 for projections, with the two that write into the
    residual stream further divided by sqrt(2 * num_layers) so the stream does not grow with
    depth, which keeps logits O(1) and sampling distributions non-degenerate.
    """
    cfg, tp = model.config, model.tp
    gen = torch.Generator(device=model.device)
    gen.manual_seed(seed)
    residual_scale = 1.0 / math.sqrt(2 * cfg.num_layers)
    h, inter, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    q_full, kv_full = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    # A tied head reads the embedding as its projection, so it needs the head's scale.
    embed_std = h ** -0.5 if cfg.tie_word_embeddings else 1.0
    _normal(gen, embed_std, model.embed_tokens, (v, h),
            [("model.embed_tokens.weight", v, model.embed_tokens)], tp)
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        layer.input_layernorm.fill_(1.0)
        layer.post_attention_layernorm.fill_(1.0)
        qkv = zip(("q", "k", "v"), (q_full, kv_full, kv_full),
                  layer.qkv_proj.split([layer.q_size, layer.kv_size, layer.kv_size]), strict=True)
        _normal(gen, h ** -0.5, layer.qkv_proj, (q_full + 2 * kv_full, h),
                [(f"{p}self_attn.{n}_proj.weight", rows, view) for n, rows, view in qkv], tp,
                _fp8(cfg.fp8, layer, "qkv_proj"))
        if layer.qkv_bias is not None:
            biases = zip(("q", "k", "v"), (q_full, kv_full, kv_full),
                         layer.qkv_bias.split([layer.q_size, layer.kv_size, layer.kv_size]),
                         strict=True)
            _normal(gen, 0.1, layer.qkv_bias, (q_full + 2 * kv_full,),
                    [(f"{p}self_attn.{n}_proj.bias", rows, view) for n, rows, view in biases],
                    tp)
        for norm in (layer.q_norm, layer.k_norm):
            if norm is not None:
                norm.fill_(1.0)
        _normal(gen, q_full ** -0.5 * residual_scale, layer.o_proj, (h, q_full),
                [(p + "self_attn.o_proj.weight", h, layer.o_proj)], tp,
                _fp8(cfg.fp8, layer, "o_proj"))
        if layer.moe is not None:
            init_moe(layer.moe, gen, residual_scale, cfg.fp8)
            continue
        assert layer.gate_up_proj is not None and layer.down_proj is not None
        gate, up = layer.gate_up_proj.split(layer.gate_up_proj.shape[0] // 2)
        _normal(gen, h ** -0.5, layer.gate_up_proj, (2 * inter, h),
                [(p + "mlp.gate_proj.weight", inter, gate), (p + "mlp.up_proj.weight", inter, up)],
                tp, _fp8(cfg.fp8, layer, "gate_up_proj"))
        _normal(gen, inter ** -0.5 * residual_scale, layer.down_proj, (h, inter),
                [(p + "mlp.down_proj.weight", h, layer.down_proj)], tp,
                _fp8(cfg.fp8, layer, "down_proj"))
    model.norm.fill_(1.0)
    if model.lm_head is not None:
        _normal(gen, h ** -0.5, model.lm_head, (v, h), [("lm_head.weight", v, model.lm_head)],
                tp)


def _hf_tensors(model: LlamaModel) -> dict[str, torch.Tensor]:
    """The model's weights under HF names, q/k/v and gate/up split back apart (views)."""
    out: dict[str, torch.Tensor] = {"model.embed_tokens.weight": model.embed_tokens,
                                    "model.norm.weight": model.norm}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        q, k, v = layer.qkv_proj.split([layer.q_size, layer.kv_size, layer.kv_size])
        out.update({
            p + "input_layernorm.weight": layer.input_layernorm,
            p + "self_attn.q_proj.weight": q,
            p + "self_attn.k_proj.weight": k,
            p + "self_attn.v_proj.weight": v,
            p + "self_attn.o_proj.weight": layer.o_proj,
            p + "post_attention_layernorm.weight": layer.post_attention_layernorm,
        })
        if layer.moe is not None:
            out.update(moe_hf_views(layer.moe, model.config.architecture, i))
        else:
            assert layer.gate_up_proj is not None and layer.down_proj is not None
            gate, up = layer.gate_up_proj.split(layer.gate_up_proj.shape[0] // 2)
            out.update({p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                        p + "mlp.down_proj.weight": layer.down_proj})
        if layer.qkv_bias is not None:
            qb, kb, vb = layer.qkv_bias.split([layer.q_size, layer.kv_size, layer.kv_size])
            out.update({p + "self_attn.q_proj.bias": qb, p + "self_attn.k_proj.bias": kb,
                        p + "self_attn.v_proj.bias": vb})
        if layer.q_norm is not None and layer.k_norm is not None:
            out.update({p + "self_attn.q_norm.weight": layer.q_norm,
                        p + "self_attn.k_norm.weight": layer.k_norm})
    if model.lm_head is not None:
        out["lm_head.weight"] = model.lm_head
    return out


@torch.no_grad()
def save_weights(model: LlamaModel, config: ModelConfig, directory: str | Path,
                 max_shard_bytes: int | None = None) -> list[Path]:
    """Write config.json and model.safetensors (or model-0000i-of-0000n.safetensors shards
    plus an index when max_shard_bytes is set). Returns the safetensors files written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf = hf_config_dict(config, str(model.dtype).removeprefix("torch."))
    (directory / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    # Planned from sizes first and copied to the host one shard at a time: a MoE checkpoint
    # (Mixtral-8x7B, 93 GB in bf16) would not fit in host memory all at once.
    plan: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, t in {**_hf_tensors(model), **fp8_scale_views(model)}.items():
        nbytes = t.numel() * t.element_size()
        if max_shard_bytes is not None and plan[-1] and size + nbytes > max_shard_bytes:
            plan.append([])
            size = 0
        plan[-1].append((name, t))
        size += nbytes
    if len(plan) == 1:
        names = ["model.safetensors"]
    else:
        names = [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))]
        weight_map = {t: n for n, shard in zip(names, plan, strict=True) for t, _ in shard}
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2) + "\n")
    paths = [directory / n for n in names]
    for path, shard in zip(paths, plan, strict=True):
        # safetensors refuses views that share storage; each tensor gets its own copy.
        tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in shard}
        save_file(tensors, str(path), metadata={"format": "pt"})
    return paths


@torch.no_grad()
def load_weights(directory: str | Path, model: LlamaModel) -> int:
    """Copy every tensor of an HF Llama directory into the model (fusing q/k/v and gate/up).

    Reads the weight files (one file, or the shards model.safetensors.index.json lists:
    config.weight_index) through weight_stream: parallel reads
    into pinned slices overlapped with the device copies. Returns the bytes copied.
    """
    directory = Path(directory)
    check_config_matches(model.config, directory)
    # Every key config.json says twice, or that the reference does not apply: which one won.
    for note in read_model_dir(directory, max_model_len=1)[1]:
        logger.log(logging.WARNING if note.warning else logging.INFO, "model %s: %s: %s",
                   directory, note.key, note.text)
    cfg, rope = model.config, model.config.rope
    logger.info("model %s: architecture %s, %d layers, %d/%d heads of %d, %s, rope %s theta "
                "%g factor %g, sliding window %s, max_model_len %d, tied head %s, dtype %s",
                directory, cfg.architecture, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads,
                cfg.head_dim, f"{cfg.num_experts} experts of {cfg.moe_intermediate_size} "
                f"(top {cfg.num_experts_per_tok}, renormalised {cfg.norm_topk_prob})"
                if cfg.is_moe else f"MLP {cfg.intermediate_size}",
                rope.rope_type, rope.theta, rope.factor, cfg.sliding_window,
                cfg.max_model_len, cfg.tie_word_embeddings,
                str(model.dtype).removeprefix("torch."))
    if cfg.fp8 is not None:
        logger.info("model %s: %s", directory, describe(cfg.fp8))
    start = time.perf_counter()
    listed = weight_files(directory)
    log_unlisted(listed, directory)
    where = index_weight_files(directory, model.config, listed)  # names and shapes checked
    headers = {f: read_header(f) for f in set(where.values())}
    # Each target is a view into its fused parameter, so landing the bytes there is the fusion.
    # FP8 scales land in place, or (per-tensor and input scales) in temporaries spread or
    # reduced into the fused scales by fp8_finish once read.
    fp8_targets, fp8_finish = fp8_load_targets(
        model, {n: headers[f][n] for n, f in where.items() if n.endswith("_scale")
                or n.endswith("_scale_inv")})
    copies = [(where[name], headers[where[name]][name], target)
              for name, target in {**_hf_tensors(model), **fp8_targets}.items()]
    column_blocks: list[tuple[Path, str, torch.Tensor]] = []
    if model.tp is not None:  # this rank's rows only; its column blocks by safetensors slice
        copies, column_blocks = model.tp.shard_copies(copies)
    stats = stream_into(copies, model.device)
    fp8_finish()
    if column_blocks:
        model.tp.read_column_blocks(column_blocks)
    seconds = time.perf_counter() - start
    copied = sum(t.numel() * t.element_size() for _, _, t in copies)
    copied += sum(t.numel() * t.element_size() for _, _, t in column_blocks)
    logger.info("weights read: %d files, %.3f GB in %.3f s (%.2f GB/s), %d reads by %d "
                "threads, %s", len(headers), stats.bytes_read / 1e9, seconds,
                stats.bytes_read / 1e9 / max(seconds, 1e-9), stats.num_reads, stats.num_readers,
                f"staged through {stats.slice_bytes // 2**20} MiB pinned slices"
                if stats.staged else "straight into the tensors")
    return copied
