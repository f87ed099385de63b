"""Every architecture variant through the Triton kernels (interpreted on the CPU): Qwen2's
q/k/v biases and Qwen3's per-head q/k norm feed the Triton rms_norm, rotary and attention
kernels, and a yarn rope's scaled cos/sin cache is read by the Triton rotary kernel as it is
by the torch one. Tokens and logits must equal the torch backend's. (tests/gpu/ runs the
compiled kernels and the CUDA graphs.)"""

from __future__ import annotations

import pytest
import torch

from tests.runner_helpers import full_prefill_logits, prompt, tiny_config
from tests.serving_helpers import Served, greedy
from warmgate.server.config.rope_config import RopeConfig
from warmgate.server.runner.model_runner import ModelRunner

pytest.importorskip("triton")
# Positions reach past the yarn rope's original context, so its scaling is in play.
YARN = RopeConfig(rope_type="yarn", theta=1000.0, factor=4.0, original_max_position_embeddings=16)
LLAMA3 = RopeConfig(rope_type="llama3", theta=1000.0, factor=8.0,
                    original_max_position_embeddings=16)
NEW_TOKENS = 6


def _runners(architecture: str, rope: RopeConfig) -> tuple[ModelRunner, ModelRunner]:
    from warmgate.server.kernels.ops import TritonOps
    from warmgate.server.runner.attention.triton_backend import TritonAttentionBackend

    config = tiny_config(max_num_seqs=2, max_model_len=64, num_blocks=40,
                         architecture=architecture, rope=rope)
    reference = ModelRunner(config)
    runner = ModelRunner(config, ops=TritonOps())  # type: ignore[arg-type]
    runner.attention_backend = TritonAttentionBackend(runner.attention_spec)
    runner.model.backend = runner.attention_backend
    return reference, runner


@pytest.mark.parametrize(("architecture", "rope"), [("qwen3", YARN), ("qwen2", LLAMA3)])
def test_triton_kernels_match_torch(architecture: str, rope: RopeConfig) -> None:
    reference, runner = _runners(architecture, rope)
    if architecture == "qwen3":
        assert runner.model.layers[0].q_norm is not None
    else:
        assert runner.model.layers[0].qkv_bias is not None
    long_prompt = prompt(30, offset=3)
    torch.testing.assert_close(full_prefill_logits(runner, long_prompt),
                               full_prefill_logits(reference, long_prompt),
                               atol=1e-4, rtol=1e-4)
    outputs = []
    for r in (reference, runner):
        served = Served(r)  # a mixed prefill of two lengths, then batched decode
        reqs = [served.submit("a", long_prompt, greedy(NEW_TOKENS)),
                served.submit("b", prompt(7, offset=5), greedy(NEW_TOKENS))]
        served.run()
        outputs.append([q.output_token_ids for q in reqs])
    assert outputs[0] == outputs[1]
