"""Tiny random models of every architecture and rope type, built and saved by transformers,
loaded by warmgate in both config.json formats: prefill logits and 32 greedy tokens must match
transformers'.

Positions run past the rope's original context (64) so linear, llama3 and yarn scaling all
change the numbers, and rope_theta is not transformers' default (10000) so a theta read from
the wrong key is caught too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.reference_helpers import (
    hf_greedy,
    hf_last_logits,
    randomize_parameters,
    runner_for,
)
from tests.runner_helpers import full_prefill_logits
from tests.serving_helpers import Served, greedy, reference_greedy

transformers = pytest.importorskip("transformers")

ORIGINAL_CONTEXT = 64
MAX_POSITIONS = 256
PROMPT_LEN = 160
NEW_TOKENS = 32
VOCAB = 256
# float32 on both sides; the two differ only in summation order and the rope angles'
# precision (warmgate's are float64), far below this.
LOGITS_ATOL = 1e-4
ROPES: dict[str, dict[str, Any]] = {
    "default": {},
    "linear": {"factor": 4.0},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": ORIGINAL_CONTEXT},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": ORIGINAL_CONTEXT},
}
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    # A window as long as the longest sequence: present, accepted, and never biting.
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": MAX_POSITIONS}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    # Qwen3 with tied embeddings, as Qwen3-0.6B ships.
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"tie_word_embeddings": True}),
}


# Mixture of Experts: more experts than top-k so routing picks; Qwen3-MoE both with and without
# renormalised top-k weights, an expert width unlike intermediate_size (which it must not read).
MOE_ARCHITECTURES = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  {"num_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 48,
                   "norm_topk_prob": False}),
    "qwen3_moe-norm": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                       {"num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 40,
                        "norm_topk_prob": True}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None}),
}


def _build(arch: str, rope_type: str, seed: int) -> Any:
    config_cls, model_cls, extra = {**ARCHITECTURES, **MOE_ARCHITECTURES}[arch]
    rope = {"rope_type": rope_type, "rope_theta": 1000.0, **ROPES[rope_type]}
    config = getattr(transformers, config_cls)(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5, rope_parameters=rope,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, **extra)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).to(torch.float32).eval()
    randomize_parameters(model)
    return model


def _as_4x(directory: Path, target: Path) -> None:
    """The same checkpoint with a transformers 4.x config.json (rope_theta, rope_scaling)."""
    target.mkdir()
    for f in directory.iterdir():
        (target / f.name).write_bytes(f.read_bytes())
    config = json.loads((directory / "config.json").read_text())
    params = dict(config.pop("rope_parameters"))
    config["rope_theta"] = params.pop("rope_theta")
    config["rope_scaling"] = None if params["rope_type"] == "default" else params
    (target / "config.json").write_text(json.dumps(config))


@pytest.mark.slow
@pytest.mark.parametrize("rope_type", list(ROPES))
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_tiny_model_matches_transformers(arch: str, rope_type: str, tmp_path: Path) -> None:
    model = _build(arch, rope_type, seed=len(arch) * 7 + len(rope_type))
    model.save_pretrained(tmp_path / "v5")
    saved = json.loads((tmp_path / "v5" / "config.json").read_text())
    assert saved["rope_parameters"]["rope_type"] == rope_type  # the 5.x format on disk
    _as_4x(tmp_path / "v5", tmp_path / "v4")
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, VOCAB, (PROMPT_LEN,), generator=gen).tolist()
    want_logits = hf_last_logits(model, prompt)
    want_tokens = hf_greedy(model, prompt, NEW_TOKENS)
    for fmt in ("v5", "v4"):
        runner = runner_for(tmp_path / fmt, max_model_len=MAX_POSITIONS)
        assert runner.config.model.architecture == arch
        assert runner.config.model.rope.rope_type == rope_type
        got = full_prefill_logits(runner, prompt)
        diff = (got - want_logits).abs().max().item()
        assert diff <= LOGITS_ATOL, f"{fmt}: prefill logits differ by {diff}"
        assert reference_greedy(runner, prompt, NEW_TOKENS) == want_tokens, fmt


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(MOE_ARCHITECTURES))
def test_tiny_moe_matches_transformers(arch: str, tmp_path: Path) -> None:
    """Routing (softmax, top-k, renormalisation) and the experts' weights as transformers
    reads them: prefill logits, then 32 greedy tokens served at k=0 and k=3."""
    model = _build(arch, "default", seed=len(arch))
    model.save_pretrained(tmp_path)
    prompt = torch.randint(0, VOCAB, (PROMPT_LEN,), generator=torch.Generator().manual_seed(2))
    want_logits = hf_last_logits(model, prompt.tolist())
    want_tokens = hf_greedy(model, prompt.tolist(), NEW_TOKENS)
    for k in (0, 3):
        runner = runner_for(tmp_path, max_model_len=MAX_POSITIONS, num_spec=k)
        assert runner.config.model.architecture == arch.removesuffix("-norm")
        assert runner.config.model.is_moe
        if k == 0:
            diff = (full_prefill_logits(runner, prompt.tolist()) - want_logits).abs().max()
            assert diff.item() <= LOGITS_ATOL, f"prefill logits differ by {diff.item()}"
        served = Served(runner)
        req = served.submit("r", prompt.tolist(), greedy(NEW_TOKENS))
        served.run()
        assert req.output_token_ids == want_tokens, f"k={k}"
