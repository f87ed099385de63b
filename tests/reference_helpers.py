"""Shared by the reference tests: a CPU float32 torch-backend runner over an HF directory,
and a greedy run of transformers to compare it with."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from warmgate.server.config.runner_config import (
    CacheConfig,
    DeviceConfig,
    RunnerConfig,
    SchedulerConfig,
    SpeculativeConfig,
    resolve_runner_config,
)
from warmgate.server.runner.model_runner import ModelRunner
from warmgate.server.runner.weights import model_config_from_hf


def runner_for(directory: str | Path, *, max_model_len: int, num_spec: int = 0,
               max_num_seqs: int = 4, block_size: int = 16,
               attention_backend: str = "torch") -> ModelRunner:
    """A CPU float32 runner serving the HF directory, on the torch attention backend unless
    another is named (triton: its kernels in the Triton interpreter)."""
    model = model_config_from_hf(directory, max_model_len=max_model_len)
    blocks_per_seq = -(-max_model_len // block_size)
    config = RunnerConfig(
        model=model,
        cache=CacheConfig(block_size=block_size, num_blocks=max_num_seqs * blocks_per_seq + 1),
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs,
                                  max_num_batched_tokens=max_model_len),
        speculative=SpeculativeConfig(num_speculative_steps=num_spec),
        device=DeviceConfig(device="cpu", dtype="float32",
                            attention_backend=attention_backend))
    return ModelRunner(resolve_runner_config(config, cuda_available=False))


@torch.no_grad()
def hf_greedy(model: Any, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy generate: exactly max_new_tokens, never stopping at EOS."""
    ids = torch.tensor([list(prompt)])
    # No EOS: the requests compared never stop early either, and min_new_tokens would
    # instead suppress the EOS logit, changing the greedy choice. generate() fills every
    # unset field (None) from the model's own generation config, so EOS is cleared there.
    saved = copy.deepcopy(model.generation_config)
    model.generation_config.eos_token_id = None
    try:
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new_tokens, pad_token_id=0)
    finally:
        model.generation_config = saved
    if out.shape[1] - len(prompt) != max_new_tokens:
        raise AssertionError(f"transformers stopped after {out.shape[1] - len(prompt)} tokens")
    return out[0, len(prompt):].tolist()


@torch.no_grad()
def hf_last_logits(model: Any, prompt: Sequence[int]) -> torch.Tensor:
    """[V] float32 logits of transformers' forward at the prompt's last position."""
    return model(torch.tensor([list(prompt)])).logits[0, -1].float()


def randomize_parameters(model: Any) -> None:
    """Random values in every parameter, in place: transformers initialises biases to zero
    and norms to one, so a bias or norm that is not loaded (or loaded into the wrong place)
    would go unseen."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
