"""bench/lib/graph_timing.py: the projection shapes the GPU kernel benches time are the
shapes of the model's own weights (an [N, K] the wrong way round would time another GEMM)."""

from __future__ import annotations

import pytest
import torch

from tests.bench_harness import load_script
from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.runner.model import LlamaModel
from warmgate.server.runner.ops import TorchOps

timing = load_script("bench/lib/graph_timing.py")


@pytest.mark.parametrize("preset", ["tiny", "qwen3-0.6b"])
def test_projection_shapes_are_the_models_weight_shapes(preset: str) -> None:
    config = ModelConfig.from_preset(preset)
    with torch.device("meta"):
        model = LlamaModel(config, TorchOps(), None, torch.device("meta"), torch.bfloat16)
    layer = model.layers[0]
    head = model.embed_tokens if model.lm_head is None else model.lm_head
    expected = {"qkv": layer.qkv_proj, "o": layer.o_proj, "gate_up": layer.gate_up_proj,
                "down": layer.down_proj, "head": head}
    shapes, layers = timing.projection_shapes(preset)
    assert shapes == {name: tuple(w.shape) for name, w in expected.items()}
    assert layers == config.num_layers == len(model.layers)
