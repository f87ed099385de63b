"""Random init is deterministic; safetensors directories round-trip; errors name the tensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.runner_helpers import full_prefill_logits, make_runner, prompt, tiny_config, with_model
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.weights import (
    WeightsError,
    model_config_from_hf,
    save_weights,
)


def _prefill(runner: ModelRunner) -> torch.Tensor:
    return full_prefill_logits(runner, prompt(9, offset=4))


def test_same_seed_same_weights_other_seed_other_weights() -> None:
    a, b, c = make_runner(), make_runner(), make_runner(seed=1)
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.model.embed_tokens, c.model.embed_tokens)


@pytest.mark.parametrize("tied", [False, True])
def test_save_then_load_gives_identical_logits(tmp_path: Path, tied: bool) -> None:
    source = make_runner(tie_word_embeddings=tied, seed=3)
    save_weights(source.model, source.config.model, tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["num_hidden_layers"] == 2 and hf["num_key_value_heads"] == 2
    assert hf["tie_word_embeddings"] is tied
    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert "model.layers.1.self_attn.k_proj.weight" in names
    assert "model.layers.0.mlp.up_proj.weight" in names
    assert ("lm_head.weight" in names) is not tied
    config = tiny_config(tie_word_embeddings=tied)
    loaded = ModelRunner(with_model(config, weights_path=str(tmp_path), seed=99))
    assert loaded.load_stats.weights_source == str(tmp_path)
    assert loaded.load_stats.weights_bytes > 0
    torch.testing.assert_close(_prefill(loaded), _prefill(source), atol=0, rtol=0)


def test_sharded_directory_loads(tmp_path: Path) -> None:
    source = make_runner(seed=5)
    files = save_weights(source.model, source.config.model, tmp_path, max_shard_bytes=40_000)
    assert len(files) > 2
    loaded = ModelRunner(with_model(tiny_config(), weights_path=str(tmp_path)))
    torch.testing.assert_close(_prefill(loaded), _prefill(source), atol=0, rtol=0)


def test_model_config_from_hf_reads_llama_keys(tmp_path: Path) -> None:
    source = make_runner()
    save_weights(source.model, source.config.model, tmp_path)
    mc = model_config_from_hf(tmp_path, max_model_len=64)
    base = source.config.model
    for f in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
              "head_dim", "intermediate_size", "rope", "rms_norm_eps"):
        assert getattr(mc, f) == getattr(base, f), f
    assert mc.max_model_len == 64 and mc.weights_path == str(tmp_path)


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    source = make_runner()
    save_weights(source.model, source.config.model, tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["model.layers.1.mlp.gate_proj.weight"]
    save_file(tensors, str(path))
    with pytest.raises(WeightsError, match=r"model\.layers\.1\.mlp\.gate_proj\.weight"):
        ModelRunner(with_model(tiny_config(), weights_path=str(tmp_path)))


def test_wrong_shape_is_named(tmp_path: Path) -> None:
    source = make_runner()
    save_weights(source.model, source.config.model, tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = load_file(str(path))
    tensors["model.norm.weight"] = torch.ones(65)
    save_file(tensors, str(path))
    with pytest.raises(WeightsError, match=r"model\.norm\.weight.*\(65,\).*\(64,\)"):
        ModelRunner(with_model(tiny_config(), weights_path=str(tmp_path)))


def test_config_mismatch_is_named(tmp_path: Path) -> None:
    source = make_runner()
    save_weights(source.model, source.config.model, tmp_path)
    config = with_model(tiny_config(), weights_path=str(tmp_path), intermediate_size=96)
    with pytest.raises(WeightsError, match="intermediate_size"):
        ModelRunner(config)


def test_missing_config_json(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match=r"config\.json"):
        model_config_from_hf(tmp_path)
