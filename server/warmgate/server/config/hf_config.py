"""Read a Hugging Face config.json into a ModelConfig, and write one back.

Both formats transformers writes are read: 4.x (top-level `rope_theta`, `rope_scaling`) and
5.x (`rope_parameters`). Every key the reference implementation (transformers' Llama, Mistral,
Qwen2, Qwen3, Qwen3-MoE and Mixtral modeling code; the MoE keys in hf_moe) reads and that
changes the numbers is either implemented or refused with a ModelLoadError naming the file
and the key: a checkpoint served with math that differs from its reference would generate
wrong tokens while looking healthy. Where the directory says one thing twice (two rope keys,
head_dim and hidden_size / heads, dtype and torch_dtype, sliding_window and
use_sliding_window, a tied config over a file with its own lm_head.weight), transformers'
choice wins and a ConfigNote records it (`read_model_dir`); the load phase logs the notes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from warmgate.server.config.config_notes import ConfigNote, note
from warmgate.server.config.fp8_config import quantized_modules
from warmgate.server.config.hf_attention import head_dim, num_kv_heads, sliding_window
from warmgate.server.config.hf_defaults import HF_DEFAULTS
from warmgate.server.config.hf_fp8 import (
    check_ignore_list,
    fp8_from_hf,
    fp8_hf_dict,
)
from warmgate.server.config.hf_moe import moe_fields, moe_hf_keys
from warmgate.server.config.hf_rope import rope_from_hf
from warmgate.server.config.json_text import parse_json
from warmgate.server.config.model_load_error import ModelLoadError
from warmgate.server.config.runner_config import ConfigError, ModelConfig
from warmgate.server.config.tied_head import HEAD, file_head

__all__ = ["HF_ARCHITECTURES", "HF_CLASS", "ConfigNote", "ModelLoadError", "hf_config_dict",
           "max_position_embeddings", "model_config_from_hf", "read_model_dir"]

# HF class name -> ModelConfig.architecture, and the model_type transformers writes for it.
HF_ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                    "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
                    "Qwen3MoeForCausalLM": "qwen3_moe", "MixtralForCausalLM": "mixtral"}
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
               "num_experts": "num_local_experts", "num_experts_per_tok": "num_experts_per_tok",
               "moe_intermediate_size": "moe_intermediate_size",
               "architecture": "architectures", "sliding_window": "sliding_window",
               "tie_word_embeddings": "tie_word_embeddings", "fp8": "quantization_config"}
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size")
# More positions than any checkpoint of these architectures declares (Qwen2.5-1M: 1,010,000)
# by 16x: a larger value is a broken file, and everything sized by it (the rope cache, the
# automatic KV cache and block tables) would be absurd.
MAX_POSITIONS_LIMIT = 2**24
_INT = ("an integer", (int,))
# Counts and sizes config.json gives: each must be >= 1 where present.
_SIZE_KEYS = (*_REQUIRED, "num_key_value_heads", "head_dim")
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
    model_type = hf.get("model_type")
    if model_type is not None and model_type != HF_ARCHITECTURES[names[0]]:
        # transformers' Auto classes build the model model_type names, other servers the one
        # architectures names: the file must not leave that to the reader.
        raise ModelLoadError(path, "model_type", f"{model_type!r} disagrees with architectures "
                             f"{names!r} (whose model_type is "
                             f"{HF_ARCHITECTURES[names[0]]!r}); make them agree")
    return HF_ARCHITECTURES[names[0]]




def _refuse_unimplemented(hf: dict[str, Any], arch: str, path: Path) -> None:
    """Keys the reference reads for this architecture that would change the math."""
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ModelLoadError(path, "hidden_act", f"{act!r}: only 'silu' is implemented")
    # Llama's attention_bias biases q/k/v/o; Qwen3's too; Mistral and Qwen2 never read it.
    if arch in ("llama", "qwen3", "qwen3_moe") and hf.get("attention_bias"):
        raise ModelLoadError(path, "attention_bias", f"true: {arch} with attention biases "
                             "(including o_proj) is not implemented")
    if arch == "llama" and hf.get("mlp_bias"):
        raise ModelLoadError(path, "mlp_bias", "true: MLP biases are not implemented")




def _read(path: Path) -> tuple[dict[str, Any], str]:
    """config.json with the reference's defaults for absent keys, and the architecture."""
    if not path.is_file():
        raise ModelLoadError(path, "config.json", "not found; a model directory needs it")
    try:
        hf = parse_json(path.read_text())
    except (OSError, ValueError) as exc:  # ValueError: undecodable, not JSON, or too deep
        raise ModelLoadError(path, "config.json", f"unreadable: {exc}") from None
    if not isinstance(hf, dict):
        raise ModelLoadError(path, "config.json", "is not a JSON object")
    arch = _architecture(hf, path)
    for key in _REQUIRED:
        if hf.get(key) is None:
            raise ModelLoadError(path, key, "missing")
    # Only these two default on null too; a null sliding_window means "no window".
    defaults = {"rms_norm_eps": HF_DEFAULTS[arch].rms_norm_eps,
                "max_position_embeddings": HF_DEFAULTS[arch].max_position_embeddings}
    hf = {**hf, **{k: v for k, v in defaults.items() if hf.get(k) is None}}
    _check_types(hf, path)
    _check_sizes(hf, path)
    positions = hf["max_position_embeddings"]
    if not 1 <= positions <= MAX_POSITIONS_LIMIT:
        raise ModelLoadError(path, "max_position_embeddings", f"{positions} is outside "
                             f"1..{MAX_POSITIONS_LIMIT}, more than any checkpoint declares")
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


def _check_sizes(hf: dict[str, Any], path: Path) -> None:
    """A count of heads, layers or features below 1 is refused by name: the head size is
    derived from hidden_size / num_attention_heads before ModelConfig checks its fields, so
    num_attention_heads 0 ended the start-up with a ZeroDivisionError."""
    for key in _SIZE_KEYS:
        value = hf.get(key)
        if value is not None and value < 1:
            raise ModelLoadError(path, key, f"{value} must be >= 1")


def max_position_embeddings(directory: str | Path) -> int:
    """The longest sequence the checkpoint declares (transformers' default when absent)."""
    hf, _ = _read(Path(directory) / "config.json")
    return int(hf["max_position_embeddings"])


def model_config_from_hf(directory: str | Path, **overrides: Any) -> ModelConfig:
    """A ModelConfig from an HF config.json; overrides win (e.g. a lower max_model_len)."""
    return read_model_dir(directory, **overrides)[0]


def read_model_dir(directory: str | Path, **overrides: Any
                   ) -> tuple[ModelConfig, tuple[ConfigNote, ...]]:
    """model_config_from_hf, and the notes on every key another one overrode."""
    directory = Path(directory)
    path = directory / "config.json"
    notes: list[ConfigNote] = []
    hf, arch = _read(path)
    _refuse_unimplemented(hf, arch, path)
    fields: dict[str, Any] = {f: hf[k] for f, k in _HF_KEYS.items()}
    fields.update(architecture=arch, rope=rope_from_hf(hf, arch, path, notes),
                  num_kv_heads=num_kv_heads(hf, arch, notes),
                  head_dim=head_dim(hf, arch, path, notes),
                  tie_word_embeddings=_tied(hf, directory, notes),
                  name=directory.name, weights_path=str(directory),
                  fp8=fp8_from_hf(hf, path), **moe_fields(hf, arch, path))
    _dtype_notes(hf, notes)
    fields.update(overrides)
    window = sliding_window(hf, arch, path, notes)
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
    if config.fp8 is not None:
        check_ignore_list(config.fp8, quantized_modules(config), path,
                          head=not config.tie_word_embeddings)
    return config, tuple(notes)


def _tied(hf: dict[str, Any], directory: Path, notes: list[ConfigNote]) -> bool:
    """tie_word_embeddings, unless the files hold a different head: transformers then keeps
    the file's head (and warns)."""
    if not hf.get("tie_word_embeddings", False):
        return False
    head = file_head(directory)
    if head is None:
        return True
    if head.equal:
        note(notes, HEAD, f"{head.path.name} holds one equal to model.embed_tokens.weight: "
             "tied, as tie_word_embeddings says")
        return True
    note(notes, HEAD, f"tie_word_embeddings is true but {head.path.name} holds an "
         f"{HEAD} that differs from model.embed_tokens.weight: serving the file's head "
         "untied, as transformers does", warning=True)
    return False


def _dtype_notes(hf: dict[str, Any], notes: list[ConfigNote]) -> None:
    """The checkpoint's dtype is not read (--dtype decides what is computed in); transformers
    5 reads dtype before the 4.x torch_dtype."""
    new, old = hf.get("dtype"), hf.get("torch_dtype")
    if new is not None and old is not None and new != old:
        note(notes, "torch_dtype", f"{old!r} is ignored: dtype {new!r} wins, as in "
             "transformers 5", warning=True)
    named = new if new is not None else old
    if named is not None:
        note(notes, "dtype" if new is not None else "torch_dtype",
             f"{named!r}, the checkpoint's dtype, is not read: --dtype decides what the "
             "model computes in (the model line says which)")


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
    if config.architecture in ("llama", "qwen3", "qwen3_moe"):
        d["attention_bias"] = False
    d.update(moe_hf_keys(config))
    if config.fp8 is not None:
        d["quantization_config"] = fp8_hf_dict(config.fp8)
    if config.architecture in ("qwen2", "qwen3", "qwen3_moe"):
        # Qwen reads sliding_window only when use_sliding_window is set, from layer 0 here.
        d.update(use_sliding_window=config.sliding_window is not None, max_window_layers=0)
    return d
