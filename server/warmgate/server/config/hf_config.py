"""Read a Hugging Face config.json into a ModelConfig, and write one back.

Both formats transformers writes are read: 4.x (top-level `rope_theta`, `rope_scaling`) and
5.x (`rope_parameters`). Every key the reference implementation (transformers' Llama, Mistral,
Qwen2 and Qwen3 modeling code) reads and that changes the numbers is either implemented or
refused with a ModelLoadError naming the file and the key: a checkpoint served with math that
differs from its reference would generate wrong tokens while looking healthy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from warmgate.server.config.rope_config import RopeConfig, RopeError
from warmgate.server.config.runner_config import ConfigError, ModelConfig

# HF class name -> ModelConfig.architecture, and the model_type transformers writes for it.
HF_ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                    "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
HF_CLASS = {arch: cls for cls, arch in HF_ARCHITECTURES.items()}
# ModelConfig field -> config.json key, for the keys read and written as they are.
_HF_KEYS: dict[str, str] = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "rms_norm_eps": "rms_norm_eps",
    "max_model_len": "max_position_embeddings",
}
# Every ModelConfig field read from config.json -> its key, to name it in errors.
_FIELD_KEYS = {**_HF_KEYS, "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
               "architecture": "architectures", "sliding_window": "sliding_window",
               "tie_word_embeddings": "tie_word_embeddings"}
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size")
# What transformers assumes when config.json leaves a key out (each configuration_*.py).
_DEFAULT_SLIDING_WINDOW = {"mistral": 4096}
_DEFAULT_HEAD_DIM_QWEN3 = 128
_DEFAULT_ROPE_THETA = 10000.0
_DEFAULT_RMS_NORM_EPS = 1e-6
_DEFAULT_MAX_POSITIONS = {"llama": 2048, "mistral": 4096 * 32, "qwen2": 32768, "qwen3": 32768}
_INT = ("an integer", (int,))
# Rope parameters that are numbers when present (a string would be read by float() or fail).
_ROPE_NUMBERS = ("rope_theta", "factor", "original_max_position_embeddings", "low_freq_factor",
                 "high_freq_factor", "beta_fast", "beta_slow", "attention_factor", "mscale",
                 "mscale_all_dim", "partial_rotary_factor")
# config.json keys read here -> the JSON type they must have when present and not null.
_TYPED_KEYS: tuple[tuple[str, str, tuple[type, ...]], ...] = (
    *((key, *_INT) for key in (*_REQUIRED, "max_position_embeddings", "num_key_value_heads",
                               "head_dim", "sliding_window", "max_window_layers")),
    *((key, "a number", (int, float)) for key in ("rms_norm_eps", "rope_theta",
                                                  "partial_rotary_factor",
                                                  "original_max_position_embeddings")),
    ("tie_word_embeddings", "true or false", (bool,)),
    ("use_sliding_window", "true or false", (bool,)),
    ("rope_parameters", "an object", (dict,)),
    ("rope_scaling", "an object", (dict,)),
)


class ModelLoadError(ValueError):
    """A model directory cannot be served as its reference would run it: the message is one
    line naming the file and the key (config entry or tensor name)."""

    def __init__(self, path: str | Path, key: str, message: str) -> None:
        super().__init__(f"{path}: {key}: {message}")
        self.path = str(path)
        self.key = key
        self.message = message


def _architecture(hf: dict[str, Any], path: Path) -> str:
    names = hf.get("architectures")
    if names is None:  # transformers then goes by model_type, which equals our name
        if hf.get("model_type") in HF_CLASS:
            return str(hf["model_type"])
        raise ModelLoadError(path, "architectures", "missing, and model_type "
                             f"{hf.get('model_type')!r} is not one of {', '.join(HF_CLASS)}")
    if not isinstance(names, list) or len(names) != 1 or names[0] not in HF_ARCHITECTURES:
        raise ModelLoadError(path, "architectures", f"{names!r} is not supported; supported: "
                             f"{', '.join(HF_ARCHITECTURES)}")
    return HF_ARCHITECTURES[names[0]]


def _rope(hf: dict[str, Any], path: Path) -> RopeConfig:
    """RopeConfig from rope_parameters (5.x) or rope_theta + rope_scaling (4.x)."""
    if hf.get("rope_parameters") is not None:
        key, params = "rope_parameters", dict(hf["rope_parameters"])
    else:
        key, params = "rope_scaling", dict(hf.get("rope_scaling") or {})
    if any(isinstance(v, dict) for v in params.values()):
        raise ModelLoadError(path, key, "per-layer-type rope parameters are not supported")
    for name in _ROPE_NUMBERS:
        value = params.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ModelLoadError(path, f"{key}.{name}", f"{value!r} is not a number")
    rope_type = params.get("rope_type", params.get("type", "default"))
    # transformers' default_theta for all four architectures when the file names none.
    theta = params.get("rope_theta", hf.get("rope_theta"))
    theta = _DEFAULT_ROPE_THETA if theta is None else theta
    partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
    if partial is not None and partial != 1.0:
        raise ModelLoadError(path, f"{key}.partial_rotary_factor",
                             f"{partial}: partial rotary embeddings are not implemented")
    fields: dict[str, Any] = {"rope_type": rope_type, "theta": float(theta)}
    if rope_type in ("linear", "llama3", "yarn"):
        # transformers prefers a top-level original_max_position_embeddings, then the rope
        # dict's, then max_position_embeddings.
        original = hf.get("original_max_position_embeddings",
                          params.get("original_max_position_embeddings",
                                     hf.get("max_position_embeddings")))
        factor = params.get("factor")
        if factor is None and rope_type == "yarn" and original:
            factor = hf["max_position_embeddings"] / original
        if factor is None:
            raise ModelLoadError(path, f"{key}.factor", f"missing for rope_type {rope_type!r}")
        fields["factor"] = float(factor)
        if rope_type != "linear":  # linear scaling never reads the trained length
            fields["original_max_position_embeddings"] = original
    if rope_type == "llama3":
        for name in ("low_freq_factor", "high_freq_factor"):
            if params.get(name) is None:
                raise ModelLoadError(path, f"{key}.{name}", "missing for rope_type 'llama3'")
            fields[name] = float(params[name])
    if rope_type == "yarn":
        # transformers treats 0 / None as "use the paper's value" for the betas.
        fields.update(beta_fast=float(params.get("beta_fast") or 32),
                      beta_slow=float(params.get("beta_slow") or 1),
                      truncate=bool(params.get("truncate", True)),
                      attention_factor=params.get("attention_factor"),
                      mscale=params.get("mscale"), mscale_all_dim=params.get("mscale_all_dim"))
    try:
        return RopeConfig(**fields)
    except RopeError as exc:
        raise ModelLoadError(path, f"{key}.{exc.key}", exc.message) from None


def _refuse_unimplemented(hf: dict[str, Any], arch: str, path: Path) -> None:
    """Keys the reference reads for this architecture that would change the math."""
    if hf.get("quantization_config") is not None:
        raise ModelLoadError(path, "quantization_config",
                             "quantized checkpoints are not supported")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ModelLoadError(path, "hidden_act", f"{act!r}: only 'silu' is implemented")
    # Llama's attention_bias biases q/k/v/o; Qwen3's too; Mistral and Qwen2 never read it.
    if arch in ("llama", "qwen3") and hf.get("attention_bias"):
        raise ModelLoadError(path, "attention_bias", f"true: {arch} with attention biases "
                             "(including o_proj) is not implemented")
    if arch == "llama" and hf.get("mlp_bias"):
        raise ModelLoadError(path, "mlp_bias", "true: MLP biases are not implemented")


def _sliding_window(hf: dict[str, Any], arch: str, path: Path) -> int | None:
    """The attention window the reference applies to some layer, or None."""
    if arch == "mistral":
        if hf.get("layer_types") is not None:
            raise ModelLoadError(path, "layer_types", "per-layer attention types are not "
                                 "supported for MistralForCausalLM")
        window: int | None = hf.get("sliding_window", _DEFAULT_SLIDING_WINDOW["mistral"])
        return window
    if arch in ("qwen2", "qwen3") and hf.get("use_sliding_window"):
        window = hf.get("sliding_window", 4096)
        layer_types = hf.get("layer_types") or [
            "sliding_attention" if i >= hf.get("max_window_layers", 28) else "full_attention"
            for i in range(hf["num_hidden_layers"])]
        return window if "sliding_attention" in layer_types else None
    return None


def _read(path: Path) -> tuple[dict[str, Any], str]:
    """config.json with the reference's defaults for absent keys, and the architecture."""
    if not path.is_file():
        raise ModelLoadError(path, "config.json", "not found; a model directory needs it")
    try:
        hf = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(path, "config.json", f"unreadable: {exc}") from None
    if not isinstance(hf, dict):
        raise ModelLoadError(path, "config.json", "is not a JSON object")
    arch = _architecture(hf, path)
    for key in _REQUIRED:
        if hf.get(key) is None:
            raise ModelLoadError(path, key, "missing")
    # Only these two default on null too; a null sliding_window means "no window".
    defaults = {"rms_norm_eps": _DEFAULT_RMS_NORM_EPS,
                "max_position_embeddings": _DEFAULT_MAX_POSITIONS[arch]}
    hf = {**hf, **{k: v for k, v in defaults.items() if hf.get(k) is None}}
    _check_types(hf, path)
    return hf, arch


def _check_types(hf: dict[str, Any], path: Path) -> None:
    """A value of the wrong JSON type is refused by name: read as is, "512" or 2.0 fails
    later with a TypeError, and the string "no" would read as a true tie_word_embeddings."""
    for key, kind, types in _TYPED_KEYS:
        value = hf.get(key)
        # bool is an int in Python; true as a size is a broken file, not 1.
        if value is not None and (isinstance(value, bool) != (types == (bool,))
                                  or not isinstance(value, types)):
            raise ModelLoadError(path, key, f"{value!r} is not {kind}")


def max_position_embeddings(directory: str | Path) -> int:
    """The longest sequence the checkpoint declares (transformers' default when absent)."""
    hf, _ = _read(Path(directory) / "config.json")
    return int(hf["max_position_embeddings"])


def model_config_from_hf(directory: str | Path, **overrides: Any) -> ModelConfig:
    """A ModelConfig from an HF config.json; overrides win (e.g. a lower max_model_len)."""
    directory = Path(directory)
    path = directory / "config.json"
    hf, arch = _read(path)
    _refuse_unimplemented(hf, arch, path)
    fields: dict[str, Any] = {f: hf[k] for f, k in _HF_KEYS.items()}
    heads = hf["num_attention_heads"]
    default_head_dim = _DEFAULT_HEAD_DIM_QWEN3 if arch == "qwen3" else hf["hidden_size"] // heads
    fields.update(architecture=arch, rope=_rope(hf, path),
                  num_kv_heads=hf.get("num_key_value_heads") or heads,
                  head_dim=hf.get("head_dim") or default_head_dim,
                  tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                  name=directory.name, weights_path=str(directory))
    fields.update(overrides)
    window = _sliding_window(hf, arch, path)
    if window is not None and window < fields["max_model_len"]:
        raise ModelLoadError(path, "sliding_window", f"{window} is shorter than max_model_len "
                             f"{fields['max_model_len']}; sliding-window attention is not "
                             f"implemented, serve it with --max-model-len {window} or less")
    fields["sliding_window"] = window
    try:
        config = ModelConfig(**fields)
    except ConfigError as exc:
        field_name = exc.field_name.removeprefix("model.")
        raise ModelLoadError(path, _FIELD_KEYS.get(field_name, field_name),
                             exc.message) from None
    return config


def hf_config_dict(config: ModelConfig, dtype_name: str) -> dict[str, Any]:
    """config.json in transformers 5's format (rope_parameters) for `config`."""
    rope = config.rope
    params: dict[str, Any] = {"rope_type": rope.rope_type, "rope_theta": rope.theta}
    if rope.rope_type != "default":
        params["factor"] = rope.factor
    if rope.rope_type in ("llama3", "yarn"):
        params["original_max_position_embeddings"] = rope.original_max_position_embeddings
    if rope.rope_type == "llama3":
        params.update(low_freq_factor=rope.low_freq_factor,
                      high_freq_factor=rope.high_freq_factor)
    if rope.rope_type == "yarn":
        params.update(beta_fast=rope.beta_fast, beta_slow=rope.beta_slow, truncate=rope.truncate,
                      attention_factor=rope.attention_factor, mscale=rope.mscale,
                      mscale_all_dim=rope.mscale_all_dim)
    d: dict[str, Any] = {hf: getattr(config, f) for f, hf in _HF_KEYS.items()}
    d.update(architectures=[HF_CLASS[config.architecture]], model_type=config.architecture,
             num_key_value_heads=config.num_kv_heads, head_dim=config.head_dim,
             tie_word_embeddings=config.tie_word_embeddings, hidden_act="silu",
             rope_parameters=params, sliding_window=config.sliding_window,
             dtype=dtype_name)
    if config.architecture in ("llama", "qwen3"):
        d["attention_bias"] = False
    if config.architecture in ("qwen2", "qwen3"):
        # Qwen reads sliding_window only when use_sliding_window is set, from layer 0 here.
        d.update(use_sliding_window=config.sliding_window is not None, max_window_layers=0)
    return d
