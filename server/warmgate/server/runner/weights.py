"""Weights: seeded random init, and Hugging Face Llama directories (config.json + safetensors).

Kernel compilation depends on shapes and dtypes, not values, so random weights compile what
real ones would; a local HF directory gives real numbers when a test or a benchmark needs them.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from warmgate.server.config import ModelConfig
from warmgate.server.runner.model import LlamaModel

logger = logging.getLogger(__name__)

# ModelConfig field -> HF Llama config.json key.
_HF_KEYS: dict[str, str] = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "intermediate_size": "intermediate_size",
    "rope_theta": "rope_theta",
    "rms_norm_eps": "rms_norm_eps",
    "max_model_len": "max_position_embeddings",
    "tie_word_embeddings": "tie_word_embeddings",
}
# Fields that decide tensor shapes or the numbers computed from them; a config that disagrees
# on one would load garbage or fail half-way, so loading refuses up front.
MATCH_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                "head_dim", "intermediate_size", "tie_word_embeddings", "rope_theta",
                "rms_norm_eps")


class WeightsError(ValueError):
    """A weights directory is missing a tensor or holds one of the wrong shape."""


@torch.no_grad()
def init_random_weights(model: LlamaModel, seed: int) -> None:
    """Fill every parameter from one generator on the model's device (no host round trip).

    The same seed gives the same weights on the same device type. Standard deviations keep
    activations near unit scale at any width: fan_in^-0.5 for projections, with the two that
    write into the residual stream further divided by sqrt(2 * num_layers) so the stream does
    not grow with depth, which keeps logits O(1) and sampling distributions non-degenerate.
    """
    cfg = model.config
    gen = torch.Generator(device=model.device)
    gen.manual_seed(seed)
    residual_scale = 1.0 / math.sqrt(2 * cfg.num_layers)
    # A tied head reads the embedding as its projection, so it needs the head's scale.
    embed_std = cfg.hidden_size ** -0.5 if cfg.tie_word_embeddings else 1.0
    model.embed_tokens.normal_(0.0, embed_std, generator=gen)
    for layer in model.layers:
        layer.input_layernorm.fill_(1.0)
        layer.post_attention_layernorm.fill_(1.0)
        layer.qkv_proj.normal_(0.0, cfg.hidden_size ** -0.5, generator=gen)
        layer.o_proj.normal_(0.0, layer.q_size ** -0.5 * residual_scale, generator=gen)
        layer.gate_up_proj.normal_(0.0, cfg.hidden_size ** -0.5, generator=gen)
        layer.down_proj.normal_(0.0, cfg.intermediate_size ** -0.5 * residual_scale,
                                generator=gen)
    model.norm.fill_(1.0)
    if model.lm_head is not None:
        model.lm_head.normal_(0.0, cfg.hidden_size ** -0.5, generator=gen)


def _hf_tensors(model: LlamaModel) -> dict[str, torch.Tensor]:
    """The model's weights under HF names, q/k/v and gate/up split back apart (views)."""
    cfg = model.config
    out: dict[str, torch.Tensor] = {"model.embed_tokens.weight": model.embed_tokens,
                                    "model.norm.weight": model.norm}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        q, k, v = layer.qkv_proj.split([layer.q_size, layer.kv_size, layer.kv_size])
        gate, up = layer.gate_up_proj.split(cfg.intermediate_size)
        out.update({
            p + "input_layernorm.weight": layer.input_layernorm,
            p + "self_attn.q_proj.weight": q,
            p + "self_attn.k_proj.weight": k,
            p + "self_attn.v_proj.weight": v,
            p + "self_attn.o_proj.weight": layer.o_proj,
            p + "post_attention_layernorm.weight": layer.post_attention_layernorm,
            p + "mlp.gate_proj.weight": gate,
            p + "mlp.up_proj.weight": up,
            p + "mlp.down_proj.weight": layer.down_proj,
        })
    if model.lm_head is not None:
        out["lm_head.weight"] = model.lm_head
    return out


def hf_config_dict(config: ModelConfig, dtype: torch.dtype) -> dict[str, Any]:
    d: dict[str, Any] = {hf: getattr(config, f) for f, hf in _HF_KEYS.items()}
    d.update(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
             torch_dtype=str(dtype).removeprefix("torch."))
    return d


@torch.no_grad()
def save_weights(model: LlamaModel, config: ModelConfig, directory: str | Path,
                 max_shard_bytes: int | None = None) -> list[Path]:
    """Write config.json and model.safetensors (or model-0000i-of-0000n.safetensors shards
    plus an index when max_shard_bytes is set). Returns the safetensors files written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf_config_dict(config, model.dtype),
                                                      indent=2) + "\n")
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in _hf_tensors(model).items():
        nbytes = t.numel() * t.element_size()
        if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        # safetensors refuses views that share storage; each tensor gets its own copy.
        shards[-1][name] = t.detach().to("cpu").contiguous().clone()
        size += nbytes
    if len(shards) == 1:
        names = ["model.safetensors"]
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                 for i in range(len(shards))]
        weight_map = {t: n for n, shard in zip(names, shards, strict=True) for t in shard}
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2) + "\n")
    paths = [directory / n for n in names]
    for path, shard in zip(paths, shards, strict=True):
        save_file(shard, str(path), metadata={"format": "pt"})
    return paths


def model_config_from_hf(directory: str | Path, **overrides: Any) -> ModelConfig:
    """A ModelConfig from an HF Llama config.json; overrides win (e.g. a lower max_model_len)."""
    directory = Path(directory)
    path = directory / "config.json"
    if not path.is_file():
        raise WeightsError(f"{path}: not found; a weights directory needs config.json")
    hf = json.loads(path.read_text())
    missing = [k for k in ("vocab_size", "hidden_size", "num_hidden_layers",
                           "num_attention_heads", "intermediate_size") if k not in hf]
    if missing:
        raise WeightsError(f"{path}: missing key(s) {missing}")
    if hf.get("rope_scaling"):
        logger.warning("%s: rope_scaling %s is ignored; positions are rotated with plain RoPE",
                       path, hf["rope_scaling"])
    fields: dict[str, Any] = {f: hf[k] for f, k in _HF_KEYS.items() if hf.get(k) is not None}
    fields.setdefault("num_kv_heads", hf["num_attention_heads"])
    fields.setdefault("head_dim", hf["hidden_size"] // hf["num_attention_heads"])
    fields.update(name=directory.name, weights_path=str(directory))
    fields.update(overrides)
    return ModelConfig(**fields)


def check_config_matches(config: ModelConfig, directory: str | Path) -> None:
    """Raise naming every field where config disagrees with the directory's config.json."""
    on_disk = model_config_from_hf(directory)
    diffs = [f"{f}: config has {getattr(config, f)}, {directory}/config.json has "
             f"{getattr(on_disk, f)}" for f in MATCH_FIELDS
             if getattr(config, f) != getattr(on_disk, f)]
    if config.max_model_len > on_disk.max_model_len:
        diffs.append(f"max_model_len: {config.max_model_len} exceeds the directory's "
                     f"max_position_embeddings {on_disk.max_model_len}")
    if diffs:
        raise WeightsError("model config does not match the weights directory (build it with "
                           "model_config_from_hf): " + "; ".join(diffs))


@torch.no_grad()
def load_weights(directory: str | Path, model: LlamaModel) -> int:
    """Copy every tensor of an HF Llama directory into the model (fusing q/k/v and gate/up).

    Reads all *.safetensors files (one file or shards). Returns the bytes copied.
    """
    directory = Path(directory)
    check_config_matches(model.config, directory)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"{directory}: no *.safetensors files")
    where: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 - safe_open is not a dict
                if key in where:
                    raise WeightsError(f"tensor {key!r} appears in both {where[key].name} "
                                       f"and {f.name}")
                where[key] = f
    targets = _hf_tensors(model)
    missing = [name for name in targets if name not in where]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(f"{directory}: missing tensor {missing[0]!r}{more}")
    copied = 0
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            for name, target in targets.items():
                if where[name] != f:
                    continue
                src = handle.get_tensor(name)
                if tuple(src.shape) != tuple(target.shape):
                    raise WeightsError(f"{f.name}: tensor {name!r} has shape "
                                       f"{tuple(src.shape)}, the model expects "
                                       f"{tuple(target.shape)}")
                # target is a view into the fused parameter, so this copy is the fusion.
                target.copy_(src)
                copied += target.numel() * target.element_size()
    return copied
