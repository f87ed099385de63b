"""The model-directory writer the benches use (devtools.checkpoint, runner.weights.save_weights)
on MoE models: what it writes is a checkpoint transformers reads as the same model (same
logits), split into per-expert tensors under each architecture's names, in shards when asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.reference_helpers import hf_last_logits, runner_for
from tests.runner_helpers import full_prefill_logits
from warmgate.server.config.rope_config import RopeConfig
from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.config.weight_files import expected_tensor_shapes
from warmgate.server.runner.model import LlamaModel
from warmgate.server.runner.ops import TorchOps
from warmgate.server.runner.weights import init_random_weights, save_weights

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=128, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
             head_dim=8, max_model_len=64, rope=RopeConfig(theta=1e6))
CONFIGS = {
    "qwen3_moe": ModelConfig(architecture="qwen3_moe", intermediate_size=96, num_experts=6,
                             num_experts_per_tok=2, moe_intermediate_size=24,
                             norm_topk_prob=False, **SMALL),  # type: ignore[arg-type]
    "mixtral": ModelConfig(architecture="mixtral", intermediate_size=40, num_experts=4,
                           num_experts_per_tok=2, moe_intermediate_size=40, norm_topk_prob=True,
                           **SMALL),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_written_moe_checkpoint_is_the_same_model_to_transformers(arch: str,
                                                                  tmp_path: Path) -> None:
    config = CONFIGS[arch]
    model = LlamaModel(config, TorchOps(), None, torch.device("cpu"), torch.float32)
    init_random_weights(model, seed=5)
    files = save_weights(model, config, tmp_path, max_shard_bytes=64 * 1024)
    assert len(files) > 1  # sharded, with an index naming every tensor
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index) == set(expected_tensor_shapes(config))
    expert = ("model.layers.1.mlp.experts.5.up_proj.weight" if arch == "qwen3_moe"
              else "model.layers.1.block_sparse_moe.experts.3.w3.weight")
    assert expert in index
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32).eval()
    prompt = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    want = hf_last_logits(reference, prompt)
    got = full_prefill_logits(runner_for(tmp_path, max_model_len=64), prompt)
    assert (got - want).abs().max().item() <= 1e-4
