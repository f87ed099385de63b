"""Structured output's hook in the sampler: the grammar's token bitmask applied to the logits
before any processor or choice."""

from __future__ import annotations

import torch


def apply_token_bitmask(logits: torch.Tensor, token_bitmask: torch.Tensor | None
                        ) -> torch.Tensor:
    """The logits with -inf on every token a row's grammar forbids; token_bitmask: [rows of
    logits, ceil(V / 32)] int32 on the logits' device (bit set = allowed; unconstrained rows
    all ones), or None, which returns the logits themselves. A masked copy, so the logits
    stay the model's own for log probabilities. xgrammar's kernel: Triton on CUDA, its C++
    loop on the CPU."""
    if token_bitmask is None:
        return logits
    import xgrammar  # only constrained steps need it; the warmup imports it before ready

    # The float32 copy the sampler computes with (the logits may be the model's bf16).
    masked = logits.to(torch.float32, copy=True)
    xgrammar.apply_token_bitmask_inplace(masked, token_bitmask, vocab_size=logits.shape[-1])
    return masked
