"""Mixture-of-Experts configuration: config.json's MoE keys read as transformers reads them,
the keys that would change the math and are not implemented refused with one line naming
them, and tensor parallel MoE refused naming its flag. No model is built: fast."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.test_startup_errors import assert_one_line_exit_2, run_server
from warmgate.server.config.hf_config import ModelLoadError, hf_config_dict, read_model_dir
from warmgate.server.config.runner_config import (
    ConfigError,
    ModelConfig,
    ParallelConfig,
    RunnerConfig,
)

QWEN3_MOE = ModelConfig(architecture="qwen3_moe", num_experts=8, num_experts_per_tok=2,
                        moe_intermediate_size=32, norm_topk_prob=True)
MIXTRAL = ModelConfig(architecture="mixtral", num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=128, norm_topk_prob=True)


def _write(directory: Path, config: ModelConfig, **edits: Any) -> Path:
    hf = {**hf_config_dict(config, "float32"), **edits}
    for key in [k for k, v in edits.items() if v is _DROP]:
        del hf[key]
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf))
    return directory


_DROP = object()


@pytest.mark.parametrize("config", [QWEN3_MOE, MIXTRAL], ids=["qwen3_moe", "mixtral"])
def test_written_config_reads_back(config: ModelConfig, tmp_path: Path) -> None:
    read, _ = read_model_dir(_write(tmp_path, config))
    for name in ("architecture", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                 "norm_topk_prob", "qk_norm"):
        assert getattr(read, name) == getattr(config, name), name


def test_transformers_spellings_and_defaults(tmp_path: Path) -> None:
    # save_pretrained writes num_local_experts for Qwen3-MoE; the Hub's files num_experts.
    local = read_model_dir(_write(tmp_path / "a", QWEN3_MOE, num_experts=_DROP,
                                  num_local_experts=8))[0]
    assert local.num_experts == 8
    # Absent: Qwen3MoeConfig's defaults (128 experts, top 8, width 768, no renormalisation).
    bare = read_model_dir(_write(tmp_path / "b", QWEN3_MOE, num_experts=_DROP,
                                 num_experts_per_tok=_DROP, moe_intermediate_size=_DROP,
                                 norm_topk_prob=_DROP))[0]
    assert (bare.num_experts, bare.num_experts_per_tok, bare.moe_intermediate_size,
            bare.norm_topk_prob) == (128, 8, 768, False)
    # Mixtral's experts are intermediate_size wide and always renormalised.
    mixtral = read_model_dir(_write(tmp_path / "c", MIXTRAL, intermediate_size=96))[0]
    assert (mixtral.moe_intermediate_size, mixtral.norm_topk_prob) == (96, True)


REFUSED = {
    "decoder_sparse_step": (QWEN3_MOE, {"decoder_sparse_step": 2}),
    "mlp_only_layers": (QWEN3_MOE, {"mlp_only_layers": [0]}),
    "num_local_experts": (QWEN3_MOE, {"num_local_experts": 4}),  # disagrees with num_experts
    "num_experts_per_tok": (MIXTRAL, {"num_experts_per_tok": 5}),  # more than the experts
    "attention_bias": (QWEN3_MOE, {"attention_bias": True}),
    "norm_topk_prob": (QWEN3_MOE, {"norm_topk_prob": "yes"}),
}


@pytest.mark.parametrize("key", list(REFUSED))
def test_unimplemented_or_broken_keys_refused_by_name(key: str, tmp_path: Path) -> None:
    config, edits = REFUSED[key]
    with pytest.raises(ModelLoadError) as info:
        read_model_dir(_write(tmp_path, config, **edits))
    assert str(info.value).startswith(f"{tmp_path / 'config.json'}: {key}: ")
    assert "\n" not in str(info.value)


def test_moe_fields_belong_to_moe_architectures() -> None:
    with pytest.raises(ConfigError, match=r"model\.num_experts"):
        ModelConfig(num_experts=4)
    with pytest.raises(ConfigError, match=r"model\.moe_intermediate_size"):
        ModelConfig(architecture="qwen3_moe", num_experts=4, num_experts_per_tok=2)
    with pytest.raises(ConfigError, match=r"model\.norm_topk_prob"):
        ModelConfig(architecture="mixtral", num_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=8)


def test_tensor_parallel_moe_refused_naming_the_flag() -> None:
    RunnerConfig(model=QWEN3_MOE)  # one rank is fine
    RunnerConfig(parallel=ParallelConfig(tensor_parallel_size=2))  # dense TP is untouched
    with pytest.raises(ConfigError) as info:
        RunnerConfig(model=QWEN3_MOE, parallel=ParallelConfig(tensor_parallel_size=2))
    assert info.value.field_name == "parallel.tensor_parallel_size"


def test_tensor_parallel_moe_server_exits_2_naming_the_flag() -> None:
    assert_one_line_exit_2(
        run_server("--model", "qwen3-30b-a3b", "--tensor-parallel-size", "2",
                   "--warmup-only"),
        "argument --tensor-parallel-size:", "tensor parallel MoE is not implemented")
