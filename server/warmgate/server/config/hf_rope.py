"""The rope of a config.json, in transformers' precedence.

Both formats transformers writes are read: 4.x (top-level `rope_theta`, `rope_scaling`) and
5.x (`rope_parameters`). Where a file holds both, or holds one setting in two places, the
value transformers 5 uses wins (its configuration_utils / modeling_rope_utils, checked
against 5.25) and the reader records a note naming the key that was ignored:
- `rope_scaling` over `rope_parameters` (transformers: `rope_scaling or rope_parameters`);
  the winner's `rope_theta`, else the top-level `rope_theta`, else the architecture's
  default (hf_defaults: 1e6 for Mixtral, 10000 for the others): the loser's theta is never
  read;
- the rope dict's `rope_theta` and `partial_rotary_factor` over the top-level keys;
- `rope_type` over the older `type`;
- a top-level `original_max_position_embeddings` over the dict's (the model's rotary reads
  the top-level one), else max_position_embeddings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from warmgate.server.config.config_notes import ConfigNote, note
from warmgate.server.config.hf_defaults import HF_DEFAULTS
from warmgate.server.config.model_load_error import ModelLoadError
from warmgate.server.config.rope_config import RopeConfig, RopeError

# Rope parameters that are numbers when present (a string would be read by float() or fail).
_ROPE_NUMBERS = ("rope_theta", "factor", "original_max_position_embeddings", "low_freq_factor",
                 "high_freq_factor", "beta_fast", "beta_slow", "attention_factor", "mscale",
                 "mscale_all_dim", "partial_rotary_factor")


def describe(rope: RopeConfig) -> str:
    text = f"{rope.rope_type} theta {rope.theta:g}"
    if rope.rope_type != "default":
        text += f" factor {rope.factor:g}"
    if rope.original_max_position_embeddings is not None:
        text += f" original context {rope.original_max_position_embeddings}"
    return text


def rope_from_hf(hf: dict[str, Any], arch: str, path: Path,
                 notes: list[ConfigNote] | None = None) -> RopeConfig:
    """The RopeConfig transformers builds from this config.json of architecture `arch`."""
    scaling, parameters = hf.get("rope_scaling"), hf.get("rope_parameters")
    theta = HF_DEFAULTS[arch].rope_theta
    if not scaling:
        key = "rope_parameters" if parameters is not None else "rope_scaling"
        return _rope(hf, path, key, dict(parameters or {}), theta, notes)
    rope = _rope(hf, path, "rope_scaling", dict(scaling), theta, notes)
    if parameters:
        try:
            ignored = describe(_rope(hf, path, "rope_parameters", dict(parameters), theta,
                                     None))
        except ModelLoadError as exc:
            ignored = f"unusable: {exc.key}: {exc.message}"
        if ignored == describe(rope):
            note(notes, "rope_scaling", f"rope_scaling and rope_parameters agree: {ignored}")
        else:
            note(notes, "rope_scaling", f"rope_scaling wins over rope_parameters, as in "
                 f"transformers (rope_scaling or rope_parameters): serving {describe(rope)}; "
                 f"rope_parameters ({ignored}) is ignored", warning=True)
    return rope


def _winner(notes: list[ConfigNote] | None, params: dict[str, Any], hf: dict[str, Any],
            key: str, name: str) -> Any:
    """The dict's value when it has one, else the top-level key's (transformers' setdefault)."""
    inner, outer = params.get(name), hf.get(name)
    if inner is not None and outer is not None and inner != outer:
        note(notes, name, f"top-level {name} {outer} is ignored: {key}.{name} {inner} wins, "
             "as in transformers", warning=True)
    return outer if inner is None else inner


def _original_context(hf: dict[str, Any], params: dict[str, Any], key: str,
                      notes: list[ConfigNote] | None) -> Any:
    name = "original_max_position_embeddings"
    outer, inner = hf.get(name), params.get(name)
    if outer is not None:
        if inner is not None and inner != outer:
            note(notes, name, f"{key}.{name} {inner} is ignored: the top-level {name} {outer} "
                 "wins, as in transformers' rotary embedding", warning=True)
        return outer
    if inner is not None:
        return inner
    note(notes, name, f"absent: max_position_embeddings {hf.get('max_position_embeddings')} "
         "is the original context, as in transformers")
    return hf.get("max_position_embeddings")


def _rope(hf: dict[str, Any], path: Path, key: str, params: dict[str, Any],
          default_theta: float, notes: list[ConfigNote] | None) -> RopeConfig:
    if any(isinstance(v, dict) for v in params.values()):
        raise ModelLoadError(path, key, "per-layer-type rope parameters are not supported")
    for name in _ROPE_NUMBERS:
        value = params.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ModelLoadError(path, f"{key}.{name}", f"{value!r} is not a number")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if "rope_type" in params and params.get("type", rope_type) != rope_type:
        note(notes, f"{key}.type", f"{key}.type {params['type']!r} is ignored: "
             f"{key}.rope_type {rope_type!r} wins, as in transformers", warning=True)
    # The config class's default_theta when the file names none.
    theta = _winner(notes, params, hf, key, "rope_theta")
    theta = default_theta if theta is None else theta
    partial = _winner(notes, params, hf, key, "partial_rotary_factor")
    if partial is not None and partial != 1.0:
        raise ModelLoadError(path, f"{key}.partial_rotary_factor",
                             f"{partial}: partial rotary embeddings are not implemented")
    fields: dict[str, Any] = {"rope_type": rope_type, "theta": float(theta)}
    if rope_type in ("linear", "llama3", "yarn"):
        factor = params.get("factor")
        original = (_original_context(hf, params, key, notes) if rope_type != "linear"
                    else None)  # linear scaling never reads the trained length
        if factor is None and rope_type == "yarn" and original:
            factor = hf["max_position_embeddings"] / original
            note(notes, f"{key}.factor", f"null: yarn's factor is max_position_embeddings / "
                 f"original context = {factor:g}, as in transformers")
        if factor is None:
            raise ModelLoadError(path, f"{key}.factor", f"missing for rope_type {rope_type!r}")
        fields["factor"] = float(factor)
        if original is not None:
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
