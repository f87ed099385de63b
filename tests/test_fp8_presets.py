"""The FP8 presets: the bf16 models' shapes and parameters with FP8 projections, a decode
roofline that reads those at one byte each, and a model-directory writer that writes each in
its checkpoint format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.reference_helpers import runner_for
from tests.runner_helpers import full_prefill_logits, prompt
from warmgate.server.config import presets
from warmgate.server.config.fp8_config import FP8Config
from warmgate.server.config.hf_fp8 import fp8_hf_dict
from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.devtools.checkpoint import write_checkpoint
from warmgate.server.devtools.roofline import num_params, weight_bytes_per_step
from warmgate.server.runner.model import LlamaModel
from warmgate.server.runner.ops import TorchOps

FP8_PRESETS = {"llama-3.1-8b-fp8": ("llama-3.1-8b", "tensor"),
               "qwen3-30b-a3b-fp8": ("qwen3-30b-a3b", "block")}


@pytest.mark.parametrize("preset", list(FP8_PRESETS))
def test_fp8_presets_have_the_bf16_parameters(preset: str) -> None:
    """Same shapes, same parameter count (on the meta device: nothing allocated), only the
    projections FP8, in the scheme the published checkpoints use."""
    bf16, scheme = FP8_PRESETS[preset]
    config, reference = ModelConfig.from_preset(preset), ModelConfig.from_preset(bf16)
    assert config.fp8 is not None and config.fp8.scheme == scheme
    assert num_params(config) == num_params(reference)
    model = LlamaModel(config, TorchOps(), None, torch.device("meta"), torch.bfloat16)
    weights = {n: p for n, p in model.named_parameters() if not n.endswith("_scale")}
    assert sum(p.numel() for p in weights.values()) == num_params(reference)
    fp8 = {n for n, p in weights.items() if p.dtype == torch.float8_e4m3fn}
    assert fp8 == {n for n in weights if n.rsplit(".", 1)[-1] in (
        "qkv_proj", "o_proj", "gate_up_proj", "down_proj", "w13", "w2")}


def test_the_decode_roofline_reads_fp8_projections_at_one_byte() -> None:
    """Llama-3.1-8B: 6.98B projection parameters at 1 byte plus a float32 scale per row; the
    head (525M) and norms at 2 bytes; the embedding is looked up, not read."""
    model = ModelConfig.from_preset("llama-3.1-8b-fp8")
    h, q, kv, inter = 4096, 4096, 1024, 14336
    rows = (q + 2 * kv) + h + 2 * inter + h
    projections = (q + 2 * kv) * h + h * q + 2 * inter * h + h * inter
    bf16 = 8_030_261_248 - 128256 * h - 32 * projections
    assert weight_bytes_per_step(model) == 2 * bf16 + 32 * (projections + 4 * rows)
    assert weight_bytes_per_step(model) / weight_bytes_per_step(
        ModelConfig.from_preset("llama-3.1-8b")) == pytest.approx(0.535, abs=0.005)


def test_a_moe_fp8_step_reads_the_touched_experts_at_one_byte() -> None:
    """Qwen3-30B-A3B at batch 1: 8 experts a layer, at 1 byte each plus one float32 per
    128x128 block; 64 tokens touch more experts, each still at 1 byte."""
    model, bf16 = (ModelConfig.from_preset(p) for p in ("qwen3-30b-a3b-fp8", "qwen3-30b-a3b"))
    expert = 3 * 2048 * 768
    expert_scales = 4 * ((2 * 768 // 128) * (2048 // 128) + (2048 // 128) * (768 // 128))
    attention = (4096 + 2 * 512) * 2048 + 2048 * 4096
    attention_scales = 4 * ((5120 // 128) * (2048 // 128) + (2048 // 128) * (4096 // 128))
    served = weight_bytes_per_step(bf16) / 2 - 48 * (8 * expert + attention)
    assert weight_bytes_per_step(model) == pytest.approx(
        2 * served + 48 * (8 * (expert + expert_scales) + attention + attention_scales))
    ratio = weight_bytes_per_step(model, tokens=64) / weight_bytes_per_step(bf16, tokens=64)
    assert 0.5 < ratio < 0.51  # nearly all experts of every layer: the bytes halve


@pytest.mark.parametrize("preset", list(FP8_PRESETS))
def test_the_writer_writes_each_fp8_preset_in_its_format(
        preset: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """devtools.checkpoint on the preset's FP8 config over small shapes (the real ones are
    tens of GB): the directory reads back as the same FP8 model and serves."""
    small = dict(vocab_size=256, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                 head_dim=128, intermediate_size=256, max_model_len=64)
    if ModelConfig.from_preset(preset).is_moe:
        small.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128)
    monkeypatch.setitem(presets.MODEL_PRESETS, preset,
                        {**presets.MODEL_PRESETS[preset], **small})
    fp8 = ModelConfig.from_preset(preset).fp8
    assert isinstance(fp8, FP8Config)
    line = write_checkpoint(preset, tmp_path, "cpu", "float32")
    assert line.startswith(f"wrote {preset} to {tmp_path}")
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["quantization_config"] == fp8_hf_dict(fp8)
    runner = runner_for(tmp_path, max_model_len=64)
    assert runner.config.model.fp8 == fp8
    assert runner.model.layers[1].o_proj.dtype == torch.float8_e4m3fn
    logits = full_prefill_logits(runner, prompt(20, vocab=256))
    assert torch.isfinite(logits).all() and logits.std() > 0.1
