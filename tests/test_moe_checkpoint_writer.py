"""The benches' model-directory writer (devtools.checkpoint.write_checkpoint) for the MoE
presets: `qwen3-30b-a3b` and `mixtral-8x7b` write a directory the server loads as that
architecture, with every expert's tensors. Shrunk here (the real ones are 61 and 93 GB):
the preset keeps its architecture and routing fields, only the sizes are cut."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.reference_helpers import runner_for
from warmgate.server.config.presets import MODEL_PRESETS
from warmgate.server.devtools.checkpoint import write_checkpoint
from warmgate.server.runner.model import LlamaModel
from warmgate.server.runner.ops import TorchOps
from warmgate.server.runner.weights import init_random_weights

SMALL = dict(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
             head_dim=16, intermediate_size=96, moe_intermediate_size=32)


@pytest.mark.parametrize(("preset", "hf_arch", "experts"), [
    ("qwen3-30b-a3b", "Qwen3MoeForCausalLM", 128), ("mixtral-8x7b", "MixtralForCausalLM", 8)])
def test_the_moe_presets_write_a_directory_that_loads_as_their_architecture(
        preset: str, hf_arch: str, experts: int, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Mixtral's config.json has one width, intermediate_size, for its experts.
    width = {"intermediate_size": 32} if preset == "mixtral-8x7b" else {}
    monkeypatch.setitem(MODEL_PRESETS, preset, {**MODEL_PRESETS[preset], **SMALL, **width})
    said = write_checkpoint(preset, tmp_path, "cpu", "float32")
    assert said.startswith(f"wrote {preset}")
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["architectures"] == [hf_arch]
    runner = runner_for(tmp_path, max_model_len=64)
    config = runner.config.model
    assert (config.architecture, config.num_experts, config.moe_intermediate_size) == (
        MODEL_PRESETS[preset]["architecture"], experts, 32)
    # The weights read back are the writer's seeded random ones, every expert of every layer.
    from warmgate.server.config.runner_config import ModelConfig

    written = LlamaModel(ModelConfig.from_preset(preset), TorchOps(), None,
                         torch.device("cpu"), torch.float32)
    init_random_weights(written, seed=0)
    for layer, ref in zip(runner.model.layers, written.layers, strict=True):
        torch.testing.assert_close(layer.moe.w13, ref.moe.w13, rtol=0, atol=0)
        torch.testing.assert_close(layer.moe.w2, ref.moe.w2, rtol=0, atol=0)
        torch.testing.assert_close(layer.moe.router, ref.moe.router, rtol=0, atol=0)
    assert "reused" in write_checkpoint(preset, tmp_path, "cpu", "float32")
