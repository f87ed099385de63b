"""The most output tokens/s a card can serve a steady workload at, prompts included.

The decode roofline (devtools.roofline) counts the bytes a decode step reads. A served stream
also prefills: with prompts of P tokens and outputs of O, each stream brings P prompt tokens
for every O decode steps, so a steady step at S streams runs S decodes beside S * P / O prompt
tokens. At 128 streams of the 8B with P = 2 O that is 384 rows through every projection, where
a GEMM is compute-bound on an H100 (its peak over its bandwidth is about 300 FLOP a byte). So
this ceiling takes each of a step's two kinds of work at its own bound and adds them, as the
kernels run one after the other:

  projections  max(their FLOPs at the card's dense bfloat16 peak, the weights' bytes at its
               bandwidth), the vocabulary head for the step's logits rows included
  attention    max(its FLOPs at the peak, the KV cache's bytes at the bandwidth): each decode
               reads its stream's cache (prompt + half the output on average), each prompt its
               own keys

No kernel reaches either peak, so a served figure over this says how much of the card a whole
workload gets, where the decode roofline's tokens/s is out of reach by construction whenever
prompts take compute. The peak is the vendor's dense (not sparse) bfloat16 figure, from
devtools.gpu_card's table of known cards; FP8 weights are outside this model and get no ceiling.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.devtools.roofline import (
    attention_projection_params,
    expert_params,
    kv_bytes_per_token,
    weight_bytes_per_step,
)


def projection_flops_per_token(model: ModelConfig) -> float:
    """FLOPs of one token through every layer's projections (q, k, v, o and the MLP, or a MoE
    layer's router and its top-k experts); the head is counted per logits row."""
    h = model.hidden_size
    mlp = (model.num_experts_per_tok * expert_params(model) + model.num_experts * h
           if model.is_moe else 3 * h * model.intermediate_size)
    return 2.0 * model.num_layers * (attention_projection_params(model) + mlp)


def attention_flops(model: ModelConfig, context: float) -> float:
    """FLOPs of one query token attending to `context` keys in every layer (QK and PV)."""
    return 4.0 * model.num_layers * model.num_heads * model.head_dim * context


@dataclass(frozen=True)
class ServedCeiling:
    step_s: float  # the least time of a steady step
    tokens_per_s: float  # streams / step_s
    projections_s: float
    attention_s: float
    prompt_tokens_per_step: float

    @classmethod
    def of(cls, model: ModelConfig, streams: int, prompt_len: int, output_len: int, *,
           bytes_per_s: float, flops_per_s: float, dtype_bytes: int = 2) -> ServedCeiling:
        """A steady step of `streams` streams, each prefilling prompt_len tokens for every
        output_len it decodes."""
        if model.fp8 is not None:
            raise ValueError(f"{model.name}: FP8 weights have no served ceiling here")
        prompts = streams / output_len  # prompts a step finishes, on average
        prompt_tokens = prompts * prompt_len
        rows = streams + prompt_tokens
        logits_rows = streams + prompts
        flops = (rows * projection_flops_per_token(model)
                 + logits_rows * 2.0 * model.vocab_size * model.hidden_size)
        weights = weight_bytes_per_step(model, dtype_bytes, tokens=max(1, round(rows)))
        projections = max(flops / flops_per_s, weights / bytes_per_s)
        context = prompt_len + output_len / 2
        kv = kv_bytes_per_token(model, dtype_bytes)
        # Each prompt token attends to half its prompt on average (causal).
        attn_flops = (streams * attention_flops(model, context)
                      + prompt_tokens * attention_flops(model, prompt_len / 2))
        attn_bytes = (streams * context + prompt_tokens) * kv
        attention = max(attn_flops / flops_per_s, attn_bytes / bytes_per_s)
        step = projections + attention
        return cls(step, streams / step, projections, attention, prompt_tokens)
