"""Every architecture preset (real head shapes, 2 layers) on the Triton and FlashInfer
backends, eager and replaying CUDA graphs (uniform decode and ragged), gives the torch
backend's logits.

The presets cover each variant of the decoder: Llama 3 (llama3 rope), Qwen3 (per-head q/k
norm, head_dim 128 != hidden / heads, tied head), Qwen2.5 (q/k/v biases, 12 q heads over 2
KV heads) and Mistral. Runners are driven in lockstep as in test_backends_gpu: both sides are
handed the same last token before each decode step, so a near-tie cannot split them.
"""

from __future__ import annotations

import pytest

from tests.gpu.test_backends_gpu import REL_TOL, Pair
from warmgate.server.config.runner_config import (
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    RunnerConfig,
    SchedulerConfig,
    SpeculativeConfig,
    resolve_runner_config,
)
from warmgate.server.runner.attention import backend_available
from warmgate.server.runner.model_runner import ModelRunner

pytestmark = pytest.mark.gpu

PRESETS = ["llama-3.2-1b", "qwen3-0.6b", "qwen2.5-1.5b", "mistral-7b"]
PROMPTS = {"a": 5, "b": 17, "c": 33}


def _runner(preset: str, backend: str, num_spec: int = 0, graphs: bool = False,
            ) -> ModelRunner:
    model = ModelConfig.from_preset(preset, num_layers=2, max_model_len=512)
    config = RunnerConfig(
        model=model,
        cache=CacheConfig(block_size=16, num_blocks=256),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512),
        speculative=SpeculativeConfig(num_speculative_steps=num_spec),
        device=DeviceConfig(device="cuda", dtype="bfloat16", attention_backend=backend))
    runner = ModelRunner(resolve_runner_config(config, cuda_available=True))
    if graphs:
        runner.capture_cuda_graphs()
    return runner


def _check(preset: str, backend: str, num_spec: int, graphs: bool) -> None:
    if not backend_available(backend):
        pytest.skip(f"{backend} is not installed")
    test = _runner(preset, backend, num_spec, graphs)
    pair = Pair(_runner(preset, "torch", num_spec), test)
    for rid, n in PROMPTS.items():  # 3 requests: uniform decode replays the size-4 graph
        pair.add(rid, n)
    errors = {"prefill": pair.step()}  # 55 tokens, a ragged batch
    replays = test.graph_runner.num_replays if test.graph_runner is not None else 0
    drafts = {rid: [3, 1, 4][:num_spec] for rid in PROMPTS} if num_spec else None
    for i in range(3):
        errors[f"uniform_decode_{i}"] = pair.step(drafts=drafts)
    pair.add("e", 40)
    errors["mixed"] = pair.step(num_tokens={"a": 1, "e": 40})  # 41 tokens, ragged
    worst = {k: max(v.values()) for k, v in errors.items()}
    print(f"{preset} {backend} k={num_spec} graphs={graphs} relative logits error vs "
          f"torch: {worst}")
    assert all(e <= REL_TOL for e in worst.values()), worst
    runner = test.graph_runner
    if graphs:
        assert runner is not None and runner.num_replays == replays + 3
        ragged = 2 if test.attention_backend.supports_ragged_graphs else 0
        assert runner.num_ragged_replays == ragged


@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
@pytest.mark.parametrize("preset", PRESETS)
def test_architecture_eager_matches_torch(preset: str, backend: str) -> None:
    _check(preset, backend, num_spec=0, graphs=False)


@pytest.mark.parametrize("num_spec", [0, 3])
@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
@pytest.mark.parametrize("preset", PRESETS)
def test_architecture_cuda_graphs_match_torch(preset: str, backend: str, num_spec: int) -> None:
    _check(preset, backend, num_spec=num_spec, graphs=True)

