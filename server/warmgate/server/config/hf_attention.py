"""The attention layout of a config.json: heads, head size and window, as transformers'
configuration and attention classes for the four architectures resolve them (checked
against transformers 5.25). A key that another overrides is recorded as a ConfigNote.

- head_dim, when given, wins over hidden_size / num_attention_heads (Qwen3 defaults to 128);
- num_key_value_heads, when absent, is the config class's default (Mistral 8, Qwen 32,
  Llama num_attention_heads); when null, num_attention_heads;
- Qwen2/Qwen3 apply sliding_window only with use_sliding_window, and only to layers from
  max_window_layers on (or those layer_types names); Qwen3-MoE only with use_sliding_window,
  to every layer; Mistral and Mixtral apply it whatever use_sliding_window says (Mixtral's
  default is no window); Llama never reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from warmgate.server.config.config_notes import ConfigNote, note
from warmgate.server.config.hf_defaults import HF_DEFAULTS
from warmgate.server.config.model_load_error import ModelLoadError


def head_dim(hf: dict[str, Any], arch: str, path: Path, notes: list[ConfigNote] | None) -> int:
    heads, hidden = int(hf["num_attention_heads"]), int(hf["hidden_size"])
    derived = hidden // heads
    value = hf.get("head_dim")
    if value is None and "head_dim" in hf and arch in ("qwen2", "qwen3", "qwen3_moe"):
        # Qwen's attention reads getattr(config, "head_dim"), which is then None.
        raise ModelLoadError(path, "head_dim", f"null: {arch} needs a head size")
    if value is None:
        value = HF_DEFAULTS[arch].head_dim
        if value is None:
            return derived
        note(notes, "head_dim", f"absent: the {arch} config's default {value}")
    if value != derived:
        note(notes, "head_dim", f"{value} overrides hidden_size / num_attention_heads = "
             f"{hidden} / {heads} = {derived}, as in transformers")
    return int(value)


def num_kv_heads(hf: dict[str, Any], arch: str, notes: list[ConfigNote] | None) -> int:
    heads = int(hf["num_attention_heads"])
    default = HF_DEFAULTS[arch].num_key_value_heads
    if "num_key_value_heads" not in hf and default is not None:
        note(notes, "num_key_value_heads", f"absent: the {arch} config's default {default}, "
             f"not num_attention_heads {heads}, as in transformers")
        return default
    value = hf.get("num_key_value_heads")
    return heads if value is None else int(value)


def sliding_window(hf: dict[str, Any], arch: str, path: Path,
                   notes: list[ConfigNote] | None) -> int | None:
    """The attention window the reference applies to some layer, or None."""
    window = hf.get("sliding_window")
    if arch in ("mistral", "mixtral"):
        if hf.get("layer_types") is not None:
            raise ModelLoadError(path, "layer_types", "per-layer attention types are not "
                                 f"supported for {arch}")
        if "sliding_window" not in hf and HF_DEFAULTS[arch].sliding_window is not None:
            window = HF_DEFAULTS[arch].sliding_window
            note(notes, "sliding_window", f"absent: the {arch} config's default {window}")
        if hf.get("use_sliding_window") is False and window is not None:
            note(notes, "use_sliding_window", f"false is ignored: {arch} applies "
                 f"sliding_window {window} whatever it says, as in transformers", warning=True)
        return window
    if arch == "llama":
        if window is not None:
            note(notes, "sliding_window", f"{window} is not applied: LlamaForCausalLM does not "
                 "read it")
        return None
    if arch == "qwen3_moe" and hf.get("use_sliding_window"):
        window = hf.get("sliding_window", HF_DEFAULTS[arch].sliding_window)
        return None if window is None else int(window)
    if not hf.get("use_sliding_window"):
        if window is not None:
            note(notes, "sliding_window", f"{window} is not applied: use_sliding_window is "
                 f"{str(hf.get('use_sliding_window', False)).lower()}, as in transformers")
        return None
    window = hf.get("sliding_window", HF_DEFAULTS[arch].sliding_window)
    start = hf.get("max_window_layers")
    if start is None:  # only Qwen2 and Qwen3 come here, both with a default (28)
        start = HF_DEFAULTS[arch].max_window_layers or 0
    layer_types = hf.get("layer_types")
    if layer_types:
        slides = "sliding_attention" in layer_types
    else:  # layers max_window_layers.. slide; not listed one by one: the count may be huge
        slides = max(start, 0) < hf["num_hidden_layers"]
    if not slides:
        note(notes, "sliding_window", f"{window} is not applied: no layer is a sliding one "
             f"({'layer_types' if hf.get('layer_types') else f'max_window_layers {start}'})")
        return None
    return None if window is None else int(window)
