"""Every default the config.json reader fills in for a key the file leaves out equals what
transformers' configuration class of that architecture assumes: the table entry by entry
against the classes, then whole minimal config.json files read by both."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from warmgate.server.config.hf_config import HF_CLASS, model_config_from_hf
from warmgate.server.config.hf_defaults import HF_DEFAULTS, HFDefaults

transformers = pytest.importorskip("transformers")

# hidden / heads = 64, unlike any default head size; 64 heads, unlike any default KV heads,
# which all divide it.
HEADS, HIDDEN = 64, 4096


def _config_class(arch: str) -> Any:
    return type(transformers.AutoConfig.for_model(arch))


def _moe(config: Any, name: str) -> Any:
    # Both MoE classes alias num_experts and num_local_experts; dense ones have neither.
    names = ("num_local_experts", "num_experts") if name == "num_experts" else (name,)
    return next((getattr(config, n) for n in names if hasattr(config, n)), None)


# HFDefaults field -> what the class assumes, read off an instance built with the keyword
# arguments given (only the heads and hidden size, or use_sliding_window, where the default
# is a function of them or only read with it).
_THEIRS: dict[str, Callable[[Any], Any]] = {
    "rms_norm_eps": lambda cls: cls().rms_norm_eps,
    "rope_theta": lambda cls: cls().rope_parameters["rope_theta"],
    "max_position_embeddings": lambda cls: cls().max_position_embeddings,
    # None in the table: the number of query heads.
    "num_key_value_heads": lambda cls: _none_if(
        cls(num_attention_heads=HEADS).num_key_value_heads, HEADS),
    # None in the table: hidden_size / heads (an absent or null head_dim, read as the
    # modeling code does).
    "head_dim": lambda cls: _none_if(
        getattr(cls(num_attention_heads=HEADS, hidden_size=HIDDEN), "head_dim", None)
        or HIDDEN // HEADS, HIDDEN // HEADS),
    "sliding_window": lambda cls: getattr(cls(use_sliding_window=True), "sliding_window", None),
    "max_window_layers": lambda cls: getattr(cls(), "max_window_layers", None),
    "num_experts": lambda cls: _moe(cls(), "num_experts"),
    "num_experts_per_tok": lambda cls: _moe(cls(), "num_experts_per_tok"),
    "moe_intermediate_size": lambda cls: _moe(cls(), "moe_intermediate_size"),
    "norm_topk_prob": lambda cls: _moe(cls(), "norm_topk_prob"),
}


def _none_if(value: Any, derived: Any) -> Any:
    return None if value == derived else value


def test_every_default_is_compared() -> None:
    assert set(_THEIRS) == {f.name for f in dataclasses.fields(HFDefaults)}
    assert set(HF_DEFAULTS) == set(HF_CLASS)  # every supported architecture has its row


@pytest.mark.parametrize("arch", sorted(HF_DEFAULTS))
def test_each_default_equals_the_configuration_class(arch: str) -> None:
    cls = _config_class(arch)
    ours = HF_DEFAULTS[arch]
    for name, theirs in _THEIRS.items():
        assert getattr(ours, name) == theirs(cls), f"{arch}: {name}"


def _write(directory: Path, arch: str, **keys: Any) -> Path:
    directory.mkdir()
    config = dict(architectures=[HF_CLASS[arch]], model_type=arch, vocab_size=256,
                  hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=HEADS,
                  intermediate_size=1024, **keys)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _resolved(config: Any) -> dict[str, Any]:
    """transformers' config object, as its modeling code reads it."""
    arch = config.model_type
    out = dict(theta=config.rope_parameters["rope_theta"], eps=config.rms_norm_eps,
               positions=config.max_position_embeddings,
               kv_heads=config.num_key_value_heads,
               head_dim=getattr(config, "head_dim", None) or HIDDEN // HEADS,
               tied=config.tie_word_embeddings)
    if arch in ("qwen3_moe", "mixtral"):
        out.update(experts=_moe(config, "num_experts"), top_k=config.num_experts_per_tok,
                   width=(config.intermediate_size if arch == "mixtral"
                          else config.moe_intermediate_size),
                   renormalize=True if arch == "mixtral" else config.norm_topk_prob)
    return out


def _ours(directory: Path) -> dict[str, Any]:
    c = model_config_from_hf(directory)
    out = dict(theta=c.rope.theta, eps=c.rms_norm_eps, positions=c.max_model_len,
               kv_heads=c.num_kv_heads, head_dim=c.head_dim, tied=c.tie_word_embeddings)
    if c.is_moe:
        out.update(experts=c.num_experts, top_k=c.num_experts_per_tok,
                   width=c.moe_intermediate_size, renormalize=c.norm_topk_prob)
    return out


@pytest.mark.parametrize("rope", [None, {"rope_type": "default"}],
                         ids=["no rope key", "rope_parameters without a theta"])
@pytest.mark.parametrize("arch", sorted(HF_DEFAULTS))
def test_a_minimal_config_json_reads_as_transformers_reads_it(
        arch: str, rope: dict[str, Any] | None, tmp_path: Path) -> None:
    keys = {} if rope is None else {"rope_parameters": rope}
    if arch == "mistral":  # its default window is shorter than its default length
        keys["sliding_window"] = None
    directory = _write(tmp_path / arch, arch, **keys)
    theirs = _resolved(transformers.AutoConfig.from_pretrained(directory))
    assert _ours(directory) == theirs
