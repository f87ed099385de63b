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

from warmgate.server.config.fp8_config import quantized_modules
from warmgate.server.config.hf_config import (
    ModelLoadError,
    max_position_embeddings,
    model_config_from_hf,
)
from warmgate.server.config.hf_moe import moe_weight_names
from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.config.safetensors_header import TensorEntry, read_header
from warmgate.server.config.weight_index import WeightFiles, weight_files

__all__ = ["MATCH_FIELDS", "TensorEntry", "check_config_matches", "expected_tensor_shapes",
           "index_weight_files", "read_header"]

# Fields that decide tensor shapes or the numbers computed from them; a config that disagrees
# on one would load garbage or fail half-way, so loading refuses up front.
MATCH_FIELDS = ("architecture", "vocab_size", "hidden_size", "num_layers", "num_heads",
                "num_kv_heads", "head_dim", "intermediate_size", "tie_word_embeddings", "rope",
                "rms_norm_eps", "sliding_window", "num_experts", "num_experts_per_tok",
                "moe_intermediate_size", "norm_topk_prob", "fp8")

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
    if config.fp8 is not None:
        out.update(_fp8_scale_shapes(config, out))
    return out


def _fp8_scale_shapes(config: ModelConfig, weights: dict[str, tuple[int, ...]]
                      ) -> dict[str, tuple[int, ...]]:
    """Each FP8 projection's scale (and static input scale) beside its `.weight`."""
    fp8 = config.fp8
    assert fp8 is not None
    out: dict[str, tuple[int, ...]] = {}
    for module in quantized_modules(config):
        rows, cols = weights[module + ".weight"]
        out[f"{module}.{fp8.scale_suffix}"] = fp8.scale_shape(rows, cols)
        if fp8.static_input:
            out[module + ".input_scale"] = fp8.scale_shape(1, 1)
    return out


def _per_tensor_scale(name: str, entry: TensorEntry, config: ModelConfig) -> bool:
    """Per-tensor scales are [] (ModelOpt) or [1] (compressed-tensors) in real files."""
    return (config.fp8 is not None and entry.shape in ((), (1,))
            and name.endswith((".input_scale", ".weight_scale"))
            and (config.fp8.scheme == "tensor" or name.endswith(".input_scale")))


def _fp8_dtype_problem(name: str, entry: TensorEntry, config: ModelConfig,
                       expected: dict[str, tuple[int, ...]]) -> str | None:
    """An FP8 projection must hold float8_e4m3fn bytes, anything else must not: an FP8
    tensor without its scale would be read as if it were the weight's value."""
    is_fp8 = entry.dtype.startswith("F8_")
    wants_fp8 = (config.fp8 is not None and name.endswith(".weight")
                 and f"{name[:-len('.weight')]}.{config.fp8.scale_suffix}"
                 in expected)
    if wants_fp8 and entry.dtype != "F8_E4M3":
        return (f"dtype {entry.dtype}: quantization_config makes it an FP8 projection, "
                "stored as F8_E4M3")
    if is_fp8 and not wants_fp8:
        return (f"dtype {entry.dtype}, but only the decoder projections of a checkpoint with an "
                "FP8 quantization_config are FP8 (this one has no scale to read it with)")
    return None


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


def index_weight_files(directory: str | Path, config: ModelConfig,
                       listed: WeightFiles | None = None) -> dict[str, Path]:
    """{tensor name: file} for every tensor the config needs, from the files an index lists
    (config.weight_index; `listed` when the caller has read them); ModelLoadError naming the
    file and tensor for a duplicate, missing, misshapen or unexpected one, or one the index
    places in another file."""
    directory = Path(directory)
    listed = weight_files(directory) if listed is None else listed
    if not listed.files:
        raise ModelLoadError(directory, "*.safetensors", "no weight files in the directory")
    headers = [(f, read_header(f)) for f in listed.files]
    _check_layer_count(directory, config, sum(len(h) for _, h in headers))
    expected = expected_tensor_shapes(config)
    where: dict[str, Path] = {}
    for f, header in headers:
        for name, entry in header.items():
            if name in where:
                raise ModelLoadError(f, name, f"also in {where[name].name}")
            indexed = listed.weight_map.get(name, f) if listed.weight_map else f
            if indexed != f:
                raise ModelLoadError(f, name, f"the index places it in {indexed.name}")
            where[name] = f
            if name not in expected:
                if _ignorable(name, config):
                    continue
                raise ModelLoadError(f, name, "the file holds a tensor the config says does "
                                     f"not exist for {config.architecture} (e.g. a bias or "
                                     "norm it does not have)")
            if entry.shape != expected[name] and not _per_tensor_scale(name, entry, config):
                raise ModelLoadError(f, name, f"shape {entry.shape}, the model expects "
                                     f"{expected[name]}")
            problem = _fp8_dtype_problem(name, entry, config, expected)
            if problem is not None:
                raise ModelLoadError(f, name, problem)
    missing = [name for name in expected if name not in where]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(directory, missing[0], f"missing tensor{more}")
    return {name: where[name] for name in expected}


def _check_layer_count(directory: Path, config: ModelConfig, num_tensors: int) -> None:
    """Every layer (every expert of it) holds tensors of its own: a config.json claiming
    more layers than the files hold tensors is refused before the expected names are listed,
    which for num_hidden_layers 1e30 would fill the host's memory."""
    per_layer = max(1, config.num_experts)
    if config.num_layers * per_layer > num_tensors:
        raise ModelLoadError(directory / "config.json", "num_hidden_layers",
                             f"{config.num_layers} layers"
                             f"{f' of {per_layer} experts' if per_layer > 1 else ''}, but the "
                             f"weight files hold {num_tensors} tensors in all")


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
