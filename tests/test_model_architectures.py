"""The architecture presets build the variant they name, and the compile cache's key tells
architectures and rope settings apart (they change what is compiled)."""

from __future__ import annotations

import dataclasses

import pytest

from warmgate.server.cache import cache_key, key_inputs
from warmgate.server.config.rope_config import RopeConfig, RopeError
from warmgate.server.config.runner_config import (
    ConfigError,
    ModelConfig,
    RunnerConfig,
    resolve_runner_config,
)

# (preset, architecture, qkv_bias, qk_norm, tied head)
PRESETS = [("llama-3.2-1b", "llama", False, False, True),
           ("llama-3.1-8b", "llama", False, False, False),
           ("qwen3-0.6b", "qwen3", False, True, True),
           ("qwen2.5-1.5b", "qwen2", True, False, True),
           ("mistral-7b", "mistral", False, False, False),
           ("qwen3-30b-a3b", "qwen3_moe", False, True, False),
           ("mixtral-8x7b", "mixtral", False, False, False)]


@pytest.mark.parametrize(("preset", "arch", "bias", "qk_norm", "tied"), PRESETS)
def test_preset_variant(preset: str, arch: str, bias: bool, qk_norm: bool, tied: bool) -> None:
    config = ModelConfig.from_preset(preset)
    assert (config.architecture, config.qkv_bias, config.qk_norm,
            config.tie_word_embeddings) == (arch, bias, qk_norm, tied)
    if preset.startswith("llama"):
        assert config.rope.rope_type == "llama3" and config.rope.theta == 500000.0
    assert config.is_moe == (arch in ("qwen3_moe", "mixtral"))


@pytest.mark.parametrize(("preset", "experts", "top_k", "width", "positions"), [
    ("qwen3-30b-a3b", 128, 8, 768, 40960), ("mixtral-8x7b", 8, 2, 14336, 32768)])
def test_moe_presets_route_as_published(preset: str, experts: int, top_k: int, width: int,
                                        positions: int) -> None:
    config = ModelConfig.from_preset(preset)
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size,
            config.norm_topk_prob, config.rope.theta) == (experts, top_k, width, True, 1e6)
    ModelConfig.from_preset(preset, max_model_len=positions)
    with pytest.raises(ConfigError, match=r"model\.max_model_len"):
        ModelConfig.from_preset(preset, max_model_len=positions + 1)


def _key(config: RunnerConfig) -> str:
    resolved = resolve_runner_config(config, cuda_available=False)
    return cache_key(key_inputs(resolved, gpu={"name": "cpu", "capability": "cpu"},
                                versions={"torch": "2.13.0"}))


def test_cache_key_tells_architectures_and_ropes_apart() -> None:
    base = RunnerConfig()
    keys = {_key(base)}
    for change in ({"architecture": "qwen3"}, {"architecture": "qwen2"},
                   {"rope": RopeConfig(theta=20000.0)},
                   {"rope": RopeConfig(rope_type="linear", factor=2.0)}):
        keys.add(_key(dataclasses.replace(base, model=dataclasses.replace(base.model,
                                                                           **change))))
    assert len(keys) == 5


def test_bad_model_settings_name_their_field() -> None:
    with pytest.raises(ConfigError, match=r"model\.architecture"):
        ModelConfig(architecture="gemma")
    with pytest.raises(ConfigError, match=r"model\.sliding_window"):
        ModelConfig(sliding_window=100, max_model_len=512)
    with pytest.raises(RopeError, match="rope_type"):
        RopeConfig(rope_type="dynamic")
    with pytest.raises(RopeError, match="original_max_position_embeddings"):
        RopeConfig(rope_type="yarn", factor=4.0)


def test_cache_key_tells_moe_routing_apart() -> None:
    """Experts, top-k and expert width shape the compiled MoE kernels and the router."""
    moe = ModelConfig(architecture="mixtral", num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=128, norm_topk_prob=True)
    base = RunnerConfig(model=moe)
    keys = {_key(base)}
    for change in ({"num_experts": 8}, {"num_experts_per_tok": 1},
                   {"moe_intermediate_size": 64}):
        keys.add(_key(dataclasses.replace(base, model=dataclasses.replace(moe, **change))))
    assert len(keys) == 4


def test_a_dense_models_cache_key_names_no_moe_field() -> None:
    """A dense model's key is what it was before MoE existed, so its cache entries still hit."""
    fields = key_inputs(resolve_runner_config(RunnerConfig(), cuda_available=False),
                        gpu={"name": "cpu"})["model"]
    assert not {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                "norm_topk_prob"} & set(fields)
