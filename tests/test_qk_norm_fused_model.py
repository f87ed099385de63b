"""A Qwen3-style model (per-head q/k RMSNorm) on the triton backend, through the Triton
interpreter on the CPU: the norms run inside the rope + KV-cache kernel (or, for a uniform
decode, inside the decode kernel that rotates q and k itself), so every layer
launches two RMSNorms (input and post-attention) instead of four, and the logits and tokens
equal the torch backend's, whose layers keep the separate norms. Both the default ops and
--deterministic's (the fixed-split attention branch) are covered; a model without q/k norms
hands the kernel none. And a Qwen3 / Qwen3-MoE checkpoint served on the triton backend gives
transformers' logits and greedy tokens."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

from tests.reference_helpers import hf_greedy, hf_last_logits, runner_for
from tests.runner_helpers import (
    full_prefill_logits,
    prompt,
    record_uniform_flags,
    tiny_config,
)
from tests.serving_helpers import Served, greedy, reference_greedy
from warmgate.server.kernels.invariant_ops import BatchInvariantOps
from warmgate.server.kernels.ops import TritonOps
from warmgate.server.runner.attention import triton_backend
from warmgate.server.runner.model_runner import ModelRunner

NEW_TOKENS = 4


def _norm_widths(runner: ModelRunner, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Spy on the runner's ops.rms_norm: appends each call's row width."""
    widths: list[int] = []
    ops = runner.model.ops  # the layers share the model's ops object
    real = ops.rms_norm

    def spy(x: torch.Tensor, weight: torch.Tensor, eps: float,
            residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        widths.append(x.shape[-1])
        return real(x, weight, eps, residual)

    monkeypatch.setattr(ops, "rms_norm", spy)
    return widths


def _fused_launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """Spy on the triton backend's rotations: appends, for each rope_and_cache launch and
    each decode launch that rotates itself (a DecodeRope), which it was ("cache" or
    "decode") and whether it was handed the q/k norm weights."""
    handed: list[tuple[str, bool]] = []
    real_cache, real_decode = triton_backend.rope_and_cache, triton_backend.paged_attention_decode

    def cache_spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        handed.append(("cache", kwargs.get("q_norm_weight") is not None))
        return real_cache(*args, **kwargs)

    def decode_spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        rope = kwargs.get("rope")
        if rope is not None:
            handed.append(("decode", rope.q_norm_weight is not None))
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(triton_backend, "rope_and_cache", cache_spy)
    monkeypatch.setattr(triton_backend, "paged_attention_decode", decode_spy)
    return handed


def _distinct_qk_norm_weights(runner: ModelRunner) -> None:
    """Random weights fill every norm with ones; give each layer's q and k norm a gain of
    its own (the same in every runner), so a weight applied twice, to the wrong head or not
    at all changes the logits."""
    gen = torch.Generator().manual_seed(7)
    for layer in runner.model.layers:
        for weight in (layer.q_norm, layer.k_norm):
            if weight is not None:
                weight.copy_(torch.rand(weight.shape, generator=gen) + 0.5)


def _serve(runner: ModelRunner) -> tuple[torch.Tensor, list[list[int]]]:
    """Last-row prefill logits of one prompt, then the greedy tokens of a mixed batch."""
    logits = full_prefill_logits(runner, prompt(30, offset=3))
    served = Served(runner)
    reqs = [served.submit("a", prompt(30, offset=3), greedy(NEW_TOKENS)),
            served.submit("b", prompt(7, offset=5), greedy(NEW_TOKENS))]
    served.run()
    return logits, [list(r.output_token_ids) for r in reqs]


@pytest.mark.parametrize(("architecture", "deterministic"),
                         [("qwen3", False), ("qwen3", True), ("llama", False)])
def test_the_triton_backend_normalises_q_and_k_heads_inside_the_rope_kernel(
        architecture: str, deterministic: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tiny_config(max_num_seqs=2, max_model_len=64, num_blocks=40,
                         architecture=architecture)
    head_dim, num_layers = config.model.head_dim, config.model.num_layers
    assert head_dim != config.model.hidden_size  # so a per-head norm is told apart by width
    reference = ModelRunner(config)  # the torch backend: separate per-head norms
    fused_config = dataclasses.replace(
        config, device=dataclasses.replace(config.device, attention_backend="triton"),
        numerics=dataclasses.replace(config.numerics, deterministic=deterministic))
    ops = BatchInvariantOps() if deterministic else TritonOps()
    runner = ModelRunner(fused_config, ops=ops)  # type: ignore[arg-type]
    assert runner.attention_backend.fuses_rope
    assert runner.attention_backend.spec.deterministic == deterministic
    qk_norm = architecture == "qwen3"
    assert (runner.model.layers[0].q_norm is not None) == qk_norm

    _distinct_qk_norm_weights(reference)
    _distinct_qk_norm_weights(runner)
    ref_widths = _norm_widths(reference, monkeypatch)
    ref_forwards = record_uniform_flags(reference, monkeypatch)
    ref_logits, ref_tokens = _serve(reference)
    widths = _norm_widths(runner, monkeypatch)
    forwards = record_uniform_flags(runner, monkeypatch)
    handed = _fused_launches(monkeypatch)
    logits, tokens = _serve(runner)

    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)
    assert tokens == ref_tokens
    # One rotation per layer and forward, handed the norm weights exactly when the model has
    # them: inside the decode kernel for a uniform decode (but --deterministic's, whose
    # fixed-split kernel reads the cache rope_and_cache wrote), else rope_and_cache. The
    # layers themselves then never normalise a head: two RMSNorms a layer (input,
    # post-attention) and the final one.
    where = ["decode" if uniform and not deterministic else "cache" for uniform in forwards]
    assert forwards and handed == [(w, qk_norm) for w in where for _ in range(num_layers)]
    assert ("decode" in where) != deterministic
    assert widths.count(head_dim) == 0
    assert len(widths) == len(forwards) * (2 * num_layers + 1)
    # The torch backend's layers normalise q and k apart: two more launches per layer.
    per_forward = (4 if qk_norm else 2) * num_layers + 1
    assert len(ref_widths) == len(ref_forwards) * per_forward
    assert ref_widths.count(head_dim) == len(ref_forwards) * 2 * num_layers * qk_norm


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe-norm"])
def test_a_qwen3_checkpoint_on_the_triton_backend_matches_transformers(
        arch: str, tmp_path: Path) -> None:
    from tests.test_reference_tiny import LOGITS_ATOL, MAX_POSITIONS, VOCAB, _build

    model = _build(arch, "default", seed=len(arch) + 3)  # q/k norm gains drawn around 1
    model.save_pretrained(tmp_path)
    prompt = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(4)).tolist()
    runner = runner_for(tmp_path, max_model_len=MAX_POSITIONS, attention_backend="triton")
    assert runner.attention_backend.fuses_rope and runner.config.model.qk_norm
    diff = (full_prefill_logits(runner, prompt) - hf_last_logits(model, prompt)).abs().max()
    assert diff.item() <= LOGITS_ATOL, f"prefill logits differ by {diff.item()}"
    assert reference_greedy(runner, prompt, NEW_TOKENS) == hf_greedy(model, prompt, NEW_TOKENS)
