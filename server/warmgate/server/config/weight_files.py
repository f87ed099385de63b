"""Check a weights directory against a ModelConfig from the safetensors headers alone.

Names and shapes are read without loading tensor data, so start-up can refuse a directory it
could never load (missing, misshapen or unexpected tensors, a config.json that disagrees)
before any memory is allocated; `runner.weights.load_weights` runs the same checks before it
copies. The headers are parsed in plain Python (config.safetensors_header): no torch import,
so the start-up checks run while torch is still loading in the background and the health
port binds without waiting for it.
"""

from __future__ import annotations

from pathlib import Path

from warmgate.server.config.hf_config import (
    ModelLoadError,
    max_position_embeddings,
    model_config_from_hf,
)
from warmgate.server.config.hf_moe import moe_weight_names
from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.config.safetensors_header import TensorEntry, read_header

__all__ = ["MATCH_FIELDS", "TensorEntry", "check_config_matches", "expected_tensor_shapes",
           "index_weight_files", "read_header"]

# Fields that decide tensor shapes or the numbers computed from them; a config that disagrees
# on one would load garbage or fail half-way, so loading refuses up front.
MATCH_FIELDS = ("architecture", "vocab_size", "hidden_size", "num_layers", "num_heads",
                "num_kv_heads", "head_dim", "intermediate_size", "tie_word_embeddings", "rope",
                "rms_norm_eps", "sliding_window", "num_experts", "num_experts_per_tok",
                "moe_intermediate_size", "norm_topk_prob")

# Tensors some checkpoints carry that are not parameters of the reference model either.
_NON_PARAMETER_SUFFIXES = (".rotary_emb.inv_freq",)


def expected_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor an HF checkpoint of this config holds, by name, with its shape."""
    h, d, inter = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_heads * d, config.num_kv_heads * d
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, h),
                                       "model.norm.weight": (h,)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "post_attention_layernorm.weight": (h,),
        })
        if config.is_moe:
            out.update(_moe_shapes(config, i))
        else:
            out.update({p + "mlp.gate_proj.weight": (inter, h),
                        p + "mlp.up_proj.weight": (inter, h),
                        p + "mlp.down_proj.weight": (h, inter)})
        if config.qkv_bias:
            out.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                        p + "self_attn.v_proj.bias": (kv,)})
        if config.qk_norm:
            out.update({p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
    if not config.is_pooling_model and not config.tie_word_embeddings:
        out["lm_head.weight"] = (config.vocab_size, h)
    return out


def _moe_shapes(config: ModelConfig, layer: int) -> dict[str, tuple[int, ...]]:
    h, inter = config.hidden_size, config.moe_intermediate_size
    router, experts = moe_weight_names(config.architecture, layer, config.num_experts)
    out: dict[str, tuple[int, ...]] = {router: (config.num_experts, h)}
    for gate, up, down in experts:
        out.update({gate: (inter, h), up: (inter, h), down: (h, inter)})
    return out


def _ignorable(name: str, config: ModelConfig) -> bool:
    """Tensors the reference model never reads either: rotary buffers, and a head that tied
    embeddings replace with embed_tokens (a pooling model has no head at all)."""
    if name.endswith(_NON_PARAMETER_SUFFIXES):
        return True
    return name == "lm_head.weight" and (config.tie_word_embeddings or config.is_pooling_model)


def index_weight_files(directory: str | Path, config: ModelConfig) -> dict[str, Path]:
    """{tensor name: file} for every tensor the config needs; ModelLoadError naming the file
    and tensor for a duplicate, missing, misshapen or unexpected one."""
    directory = Path(directory)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(directory, "*.safetensors", "no weight files in the directory")
    expected = expected_tensor_shapes(config)
    where: dict[str, Path] = {}
    for f in files:
        for name, entry in read_header(f).items():
            if name in where:
                raise ModelLoadError(f, name, f"also in {where[name].name}")
            where[name] = f
            if name not in expected:
                if _ignorable(name, config):
                    continue
                raise ModelLoadError(f, name, "the file holds a tensor the config says does "
                                     f"not exist for {config.architecture} (e.g. a bias or "
                                     "norm it does not have)")
            if entry.shape != expected[name]:
                raise ModelLoadError(f, name, f"shape {entry.shape}, the model expects "
                                     f"{expected[name]}")
    missing = [name for name in expected if name not in where]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(directory, missing[0], f"missing tensor{more}")
    return {name: where[name] for name in expected}


def check_config_matches(config: ModelConfig, directory: str | Path) -> None:
    """Raise naming every field where config disagrees with the directory's config.json."""
    # The directory's own window check is against its max_position_embeddings; the served
    # length is checked by ModelConfig itself.
    on_disk = model_config_from_hf(directory, max_model_len=1)
    path = Path(directory) / "config.json"
    max_positions = max_position_embeddings(directory)
    if config.max_model_len > max_positions:
        raise ModelLoadError(path, "max_model_len", f"{config.max_model_len} exceeds the "
                             f"file's max_position_embeddings {max_positions}")
    diffs = [f"{f}: config has {getattr(config, f)}, the file has {getattr(on_disk, f)}"
             for f in MATCH_FIELDS if getattr(config, f) != getattr(on_disk, f)]
    if diffs:
        raise ModelLoadError(path, diffs[0].split(":", 1)[0], "the model config does not match "
                             "the weights directory (build it with model_config_from_hf): "
                             + "; ".join(diffs))
