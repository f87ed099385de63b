"""The Mixture-of-Experts keys of a config.json, as transformers' Qwen3-MoE and Mixtral
configuration and modeling code read them (checked against transformers 5.25).

Both configs alias `num_experts` to `num_local_experts` (transformers writes the latter for
either); Mixtral's expert width is `intermediate_size` and it always renormalises its top-k
routing weights, Qwen3-MoE's width is `moe_intermediate_size` and `norm_topk_prob` says.
Keys that would change the math and are not implemented are refused by name: dense MLP layers
between MoE ones (Qwen3-MoE's `decoder_sparse_step`, `mlp_only_layers`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from warmgate.server.config.hf_defaults import HF_DEFAULTS, HFDefaults
from warmgate.server.config.model_load_error import ModelLoadError


def _int(hf: dict[str, Any], key: str, default: int, path: Path) -> int:
    value = hf.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelLoadError(path, key, f"{value!r} is not an integer")
    return value


def _num_experts(hf: dict[str, Any], defaults: HFDefaults, path: Path) -> int:
    default = defaults.num_experts
    assert default is not None  # a MoE architecture's
    given = {k: hf[k] for k in ("num_experts", "num_local_experts") if hf.get(k) is not None}
    if len(set(map(repr, given.values()))) > 1:
        raise ModelLoadError(path, "num_local_experts", f"{given['num_local_experts']!r} "
                             f"disagrees with num_experts {given['num_experts']!r} (one "
                             "attribute in transformers); make them agree")
    key = next(iter(given), "num_local_experts")
    return _int(hf, key, default, path)


def moe_fields(hf: dict[str, Any], arch: str, path: Path) -> dict[str, Any]:
    """The ModelConfig MoE fields of a config.json ({} for a dense architecture)."""
    defaults = HF_DEFAULTS[arch]
    if defaults.num_experts is None or defaults.num_experts_per_tok is None:
        return {}
    out: dict[str, Any] = {
        "num_experts": _num_experts(hf, defaults, path),
        "num_experts_per_tok": _int(hf, "num_experts_per_tok", defaults.num_experts_per_tok,
                                    path)}
    if arch == "mixtral":  # intermediate_size is required of every config.json
        out.update(moe_intermediate_size=_int(hf, "intermediate_size", 0, path),
                   norm_topk_prob=True)
        return out
    step = hf.get("decoder_sparse_step", 1)
    if step != 1:
        raise ModelLoadError(path, "decoder_sparse_step", f"{step!r}: dense MLP layers "
                             "between MoE layers are not implemented (only 1 is)")
    if hf.get("mlp_only_layers"):
        raise ModelLoadError(path, "mlp_only_layers", f"{hf['mlp_only_layers']!r}: dense MLP "
                             "layers in a MoE model are not implemented (only [] is)")
    norm = hf.get("norm_topk_prob", defaults.norm_topk_prob)
    if not isinstance(norm, bool):
        raise ModelLoadError(path, "norm_topk_prob", f"{norm!r} is not true or false")
    assert defaults.moe_intermediate_size is not None  # Qwen3-MoE's
    out.update(moe_intermediate_size=_int(hf, "moe_intermediate_size",
                                          defaults.moe_intermediate_size, path),
               norm_topk_prob=norm)
    return out


def moe_hf_keys(config: Any) -> dict[str, Any]:
    """The config.json keys that write `config`'s MoE fields back ({} when dense)."""
    if config.architecture == "mixtral":
        return {"num_local_experts": config.num_experts,
                "num_experts_per_tok": config.num_experts_per_tok}
    if config.architecture == "qwen3_moe":
        return {"num_experts": config.num_experts,
                "num_experts_per_tok": config.num_experts_per_tok,
                "moe_intermediate_size": config.moe_intermediate_size,
                "norm_topk_prob": config.norm_topk_prob, "decoder_sparse_step": 1,
                "mlp_only_layers": []}
    return {}


# Architecture -> (the MoE block's module name, and each expert's gate, up and down names).
_WEIGHT_NAMES = {"qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
                 "mixtral": ("block_sparse_moe", "w1", "w3", "w2")}


def moe_weight_names(arch: str, layer: int, num_experts: int
                     ) -> tuple[str, list[tuple[str, str, str]]]:
    """Layer `layer`'s router weight name and every expert's (gate, up, down) weight names,
    as the checkpoints on the Hub (and transformers' save_pretrained) name them."""
    block, gate, up, down = _WEIGHT_NAMES[arch]
    p = f"model.layers.{layer}.{block}."
    return p + "gate.weight", [
        tuple(f"{p}experts.{e}.{n}.weight" for n in (gate, up, down))  # type: ignore[misc]
        for e in range(num_experts)]
