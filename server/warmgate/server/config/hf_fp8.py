"""FP8 weights in a config.json: its `quantization_config` read into config.fp8_config.FP8Config,
and written back from one.

Three formats real checkpoints ship are read, and nothing else:
- compressed-tensors (`quant_method: compressed-tensors`, e.g. llm-compressor's FP8-dynamic
  Llama-3.1-8B): one config group targeting Linear, float 8-bit weights with a per-tensor
  ([1]) or per-channel ([N, 1]) `weight_scale`, 8-bit float input activations quantized
  per token on the fly (or per tensor with a static `input_scale`), an `ignore` list;
- ModelOpt (`quant_method: modelopt`, `quant_algo: FP8`): per-tensor `weight_scale` and a
  static per-tensor `input_scale` ([] or [1]), an `exclude_modules` list;
- 128x128 blocks (`quant_method: fp8`, `weight_block_size: [128, 128]`, as Qwen3-FP8 and
  DeepSeek ship): `weight_scale_inv` of [ceil(N/128), ceil(K/128)], activations quantized
  per token and 128-wide group on the fly.
Every key that changes the math and is not implemented (other bit widths or strategies,
static activation scales of the block format, an FP8 KV cache, output activations, sparsity,
an ignore list naming a projection the model runs in FP8, a key not known at all) fails the
load with a ModelLoadError naming it: served with other math, the checkpoint would generate
wrong tokens while looking healthy. Ignore entries may name only what the model keeps in the
served dtype (config.fp8_config): the head, the router.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from warmgate.server.config.fp8_config import FP8_BLOCK, FP8Config
from warmgate.server.config.model_load_error import ModelLoadError

_KEY = "quantization_config"
# Keys each format writes that say nothing about the math (bookkeeping).
_BENIGN = {
    "compressed-tensors": {"quant_method", "format", "config_groups", "ignore",
                           "kv_cache_scheme", "quantization_status", "global_compression_ratio",
                           "version", "sparsity_config", "transform_config", "provider"},
    "modelopt": {"quant_method", "quant_algo", "kv_cache_quant_algo", "exclude_modules",
                 "producer", "quantization"},
    "fp8": {"quant_method", "activation_scheme", "fmt", "weight_block_size",
            "modules_to_not_convert", "ignored_layers"},
}



def _fail(path: Path, key: str, message: str) -> ModelLoadError:
    return ModelLoadError(path, f"{_KEY}.{key}", message)


def _unknown_keys(q: dict[str, Any], fmt: str, path: Path) -> None:
    for key in q:
        if key not in _BENIGN[fmt]:
            raise _fail(path, key, f"not understood for quant_method {fmt!r}; refusing rather "
                        "than serving it with math that may differ")


def _ignore_list(value: Any, key: str, path: Path) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(path, key, f"{value!r} is not a list of module names")
    return tuple(value)


def _compressed_tensors(q: dict[str, Any], path: Path) -> FP8Config:
    _unknown_keys(q, "compressed-tensors", path)
    fmt = q.get("format", "float-quantized")
    if fmt not in ("float-quantized", "naive-quantized"):
        raise _fail(path, "format", f"{fmt!r}: only float-quantized FP8 is implemented")
    for key in ("kv_cache_scheme", "sparsity_config", "transform_config"):
        if q.get(key):
            raise _fail(path, key, f"{q[key]!r}: not implemented (only null is)")
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        raise _fail(path, "config_groups", "exactly one group is implemented (one scheme for "
                    f"every Linear), the file has {groups!r}")
    name, group = next(iter(groups.items()))
    where = f"config_groups.{name}"
    if not isinstance(group, dict):
        raise _fail(path, where, f"{group!r} is not an object")
    for key in group:
        if key not in ("targets", "weights", "input_activations", "output_activations",
                       "format"):
            raise _fail(path, f"{where}.{key}", "not understood; refusing rather than serving "
                        "it with math that may differ")
    if group.get("targets") != ["Linear"]:
        raise _fail(path, f"{where}.targets", f"{group.get('targets')!r}: only ['Linear'] is "
                    "implemented")
    if group.get("output_activations") is not None:
        raise _fail(path, f"{where}.output_activations", "quantized outputs are not "
                    "implemented (only null is)")
    weights = group.get("weights")
    _float8(weights, f"{where}.weights", path)
    assert isinstance(weights, dict)
    strategy = weights.get("strategy")
    if strategy not in ("tensor", "channel"):
        raise _fail(path, f"{where}.weights.strategy", f"{strategy!r}: only tensor and channel "
                    "FP8 weights are implemented (block scales: quant_method fp8)")
    for key, ok in (("dynamic", False), ("symmetric", True)):
        if weights.get(key, ok) != ok:
            raise _fail(path, f"{where}.weights.{key}", f"{weights[key]!r}: only {ok} is "
                        "implemented")
    for key in ("group_size", "block_structure", "actorder"):
        if weights.get(key) is not None:
            raise _fail(path, f"{where}.weights.{key}", f"{weights[key]!r}: only null is "
                        "implemented")
    acts = group.get("input_activations")
    if acts is None:
        raise _fail(path, f"{where}.input_activations", "null (weight-only FP8, activations "
                    "in bf16) is not implemented: only FP8 activations are")
    _float8(acts, f"{where}.input_activations", path)
    assert isinstance(acts, dict)
    act_strategy, dynamic = acts.get("strategy"), acts.get("dynamic")
    if (act_strategy, dynamic) not in (("token", True), ("tensor", False)):
        raise _fail(path, f"{where}.input_activations.strategy", f"{act_strategy!r} with "
                    f"dynamic {dynamic!r}: only per-token dynamic or per-tensor static "
                    "activation scales are implemented")
    if acts.get("symmetric", True) is not True or acts.get("group_size") is not None:
        raise _fail(path, f"{where}.input_activations", "only symmetric activations without "
                    "groups are implemented")
    return FP8Config(scheme=strategy, static_input=not dynamic, fmt="compressed-tensors",
                     ignore=_ignore_list(q.get("ignore"), "ignore", path))


def _float8(spec: Any, key: str, path: Path) -> None:
    if not isinstance(spec, dict):
        raise _fail(path, key, f"{spec!r} is not an object")
    if spec.get("type") != "float" or spec.get("num_bits") != 8:
        raise _fail(path, f"{key}.num_bits", f"type {spec.get('type')!r}, "
                    f"{spec.get('num_bits')!r} bits: only 8-bit float is implemented")


def _modelopt(q: dict[str, Any], path: Path) -> FP8Config:
    _unknown_keys(q, "modelopt", path)
    # hf_quant_config.json nests the settings under "quantization"; config.json has them flat.
    nested = q.get("quantization")
    settings = {**q, **nested} if isinstance(nested, dict) else q
    algo = settings.get("quant_algo")
    if algo != "FP8":
        raise _fail(path, "quant_algo", f"{algo!r}: only FP8 is implemented")
    if settings.get("kv_cache_quant_algo") is not None:
        raise _fail(path, "kv_cache_quant_algo", f"{settings['kv_cache_quant_algo']!r}: an FP8 "
                    "KV cache is not implemented (only null is)")
    for key in settings:
        if key not in _BENIGN["modelopt"]:
            raise _fail(path, f"quantization.{key}", "not understood; refusing rather than "
                        "serving it with math that may differ")
    return FP8Config(scheme="tensor", static_input=True, fmt="modelopt",
                     ignore=_ignore_list(settings.get("exclude_modules"), "exclude_modules",
                                         path))


def _block(q: dict[str, Any], path: Path) -> FP8Config:
    _unknown_keys(q, "fp8", path)
    if q.get("fmt", "e4m3") != "e4m3":
        raise _fail(path, "fmt", f"{q['fmt']!r}: only e4m3 is implemented")
    if q.get("activation_scheme", "dynamic") != "dynamic":
        raise _fail(path, "activation_scheme", f"{q['activation_scheme']!r}: static activation "
                    "scales are not implemented for block scales (only dynamic is)")
    block = q.get("weight_block_size")
    if block != [FP8_BLOCK, FP8_BLOCK]:
        raise _fail(path, "weight_block_size", f"{block!r}: only [{FP8_BLOCK}, {FP8_BLOCK}] "
                    "is implemented")
    ignore = (*_ignore_list(q.get("modules_to_not_convert"), "modules_to_not_convert", path),
              *_ignore_list(q.get("ignored_layers"), "ignored_layers", path))
    return FP8Config(scheme="block", fmt="fp8", ignore=ignore)


def fp8_from_hf(hf: dict[str, Any], path: Path) -> FP8Config | None:
    """The FP8Config of a config.json (None when it has no quantization_config)."""
    q = hf.get(_KEY)
    if q is None:
        return None
    if not isinstance(q, dict):
        raise ModelLoadError(path, _KEY, f"{q!r} is not an object")
    method = q.get("quant_method")
    readers = {"compressed-tensors": _compressed_tensors, "modelopt": _modelopt, "fp8": _block}
    if method not in readers:
        raise _fail(path, "quant_method", f"{method!r} is not supported; supported: FP8 in "
                    f"{', '.join(readers)}")
    return readers[method](q, path)


def _matches(entry: str, module: str) -> bool:
    """compressed-tensors' `re:` patterns, ModelOpt's wildcards, or a module name (or a
    prefix of one, as the fp8 format's modules_to_not_convert means it)."""
    if entry.startswith("re:"):
        return re.match(entry[3:], module) is not None
    if "*" in entry or "?" in entry:
        return fnmatch.fnmatchcase(module, entry)
    return module == entry or module.startswith(entry + ".") or module.endswith("." + entry)


def check_ignore_list(fp8: FP8Config, quantized_modules: Iterable[str], path: Path,
                      head: bool = True) -> None:
    """An ignore entry that names a module the model runs in FP8 would need that one module
    in bf16 (mixed precision inside the fused projections): refused by name. compressed-
    tensors and ModelOpt quantize every Linear the list leaves out, so their list must leave
    out the head (`head`: the model has one of its own, untied): an FP8 head is not
    implemented. The fp8 format never quantizes the head."""
    modules = list(quantized_modules)
    key = {"compressed-tensors": "ignore", "modelopt": "exclude_modules",
           "fp8": "modules_to_not_convert"}[fp8.fmt]
    if head and fp8.fmt != "fp8" and not any(_matches(e, "lm_head") for e in fp8.ignore):
        raise _fail(path, key, f"{list(fp8.ignore)!r} does not leave lm_head unquantized: "
                    "an FP8 vocabulary head is not implemented")
    for entry in fp8.ignore:
        hit = next((m for m in modules if _matches(entry, m)), None)
        if hit is not None:
            raise _fail(path, key, f"{entry!r} leaves {hit} unquantized: a bf16 projection "
                        "among FP8 ones is not implemented")


def fp8_hf_dict(fp8: FP8Config) -> dict[str, Any]:
    """The quantization_config that reads back as `fp8` (the model-directory writers)."""
    if fp8.fmt == "fp8":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
    if fp8.fmt == "modelopt":
        return {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": None,
                "exclude_modules": list(fp8.ignore)}
    float8 = {"type": "float", "num_bits": 8, "symmetric": True, "group_size": None}
    acts = ({**float8, "strategy": "tensor", "dynamic": False} if fp8.static_input
            else {**float8, "strategy": "token", "dynamic": True})
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed", "kv_cache_scheme": None,
            "ignore": list(fp8.ignore),
            "config_groups": {"group_0": {
                "targets": ["Linear"], "output_activations": None, "input_activations": acts,
                "weights": {**float8, "strategy": fp8.scheme, "dynamic": False}}}}
