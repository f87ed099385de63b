"""The HBM roofline of a decode step: the least time a step can take when every byte it must
read comes from device memory at the memory's bandwidth.

A decode step reads every weight once (the vocabulary head in full; an untied embedding table
only by the rows it looks up, which this leaves out; of a Mixture-of-Experts layer only the
experts its tokens are routed to) and the KV cache of every token each
stream attends to. At batch sizes where serving is memory-bound (decode, up to a few hundred
streams), a step cannot beat this, and a step's time over it says how much of the hardware the
engine uses. The bandwidth is the card's own (devtools.gpu_card): there is no default, so no
figure is divided by another card's.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmgate.server.config.runner_config import ModelConfig


def expert_params(model: ModelConfig) -> int:
    """Parameters of one MoE expert (gate, up, down); 0 for a dense model."""
    return 3 * model.hidden_size * model.moe_intermediate_size if model.is_moe else 0


def attention_projection_params(model: ModelConfig) -> int:
    """Weights of one layer's q, k, v and o projections (their biases left out)."""
    h, hd = model.hidden_size, model.head_dim
    q = h * model.num_heads * hd
    kv = 2 * h * model.num_kv_heads * hd
    o = model.num_heads * hd * h
    return q + kv + o


def layer_params(model: ModelConfig) -> int:
    """Parameters of one decoder layer: attention projections, MLP (a MoE layer's router and
    all its experts), the two norms."""
    h, hd = model.hidden_size, model.head_dim
    mlp = (model.num_experts * (expert_params(model) + h) if model.is_moe
           else 3 * h * model.intermediate_size)
    bias = (model.num_heads + 2 * model.num_kv_heads) * hd if model.qkv_bias else 0
    qk_norm = 2 * hd if model.qk_norm else 0
    return attention_projection_params(model) + mlp + 2 * h + bias + qk_norm


def num_params(model: ModelConfig) -> int:
    """Every parameter, the embedding table once when the head is tied to it."""
    embed = model.vocab_size * model.hidden_size
    head = 0 if model.tie_word_embeddings else embed
    return model.num_layers * layer_params(model) + embed + head + model.hidden_size


def experts_touched(model: ModelConfig, tokens: int) -> float:
    """Experts per layer a step of `tokens` tokens reads: every one of a dense model's one
    MLP; for a MoE model the expected number of distinct experts when each token picks its
    top-k uniformly, E * (1 - (1 - k/E)^tokens): k at one token, towards E as tokens grow."""
    if not model.is_moe:
        return 1.0
    e, k = model.num_experts, model.num_experts_per_tok
    return e * (1.0 - (1.0 - k / e) ** tokens)


def active_params(model: ModelConfig, tokens: int = 1) -> float:
    """Parameters a step of `tokens` tokens reads: all but the experts it does not route to
    (for one token, the published "active" count: every non-expert weight and k experts)."""
    if not model.is_moe:
        return float(num_params(model))
    idle = model.num_experts - experts_touched(model, tokens)
    return num_params(model) - model.num_layers * idle * expert_params(model)


def fp8_projections(model: ModelConfig, tokens: int = 1) -> list[tuple[int, int, float]]:
    """(rows, cols, how many a step reads per layer) of each projection an FP8 model stores
    in FP8 (runner.model): q/k/v, o, and the MLP's gate/up and down (a MoE layer's: those of
    the experts the step touches); [] for a model without FP8 weights."""
    if model.fp8 is None:
        return []
    h, hd, inter = model.hidden_size, model.head_dim, model.moe_intermediate_size
    attention = [((model.num_heads + 2 * model.num_kv_heads) * hd, h, 1.0),
                 (h, model.num_heads * hd, 1.0)]
    if model.is_moe:
        touched = experts_touched(model, tokens)
        return [*attention, (2 * inter, h, touched), (h, inter, touched)]
    return [*attention, (2 * model.intermediate_size, h, 1.0),
            (h, model.intermediate_size, 1.0)]


def _scale_bytes(model: ModelConfig, rows: int, cols: int) -> int:
    """float32 scales of one FP8 weight: one per 128x128 block, or one per row."""
    assert model.fp8 is not None
    if model.fp8.scheme == "block":
        return 4 * -(-rows // 128) * -(-cols // 128)
    return 4 * rows


def weight_bytes_per_step(model: ModelConfig, dtype_bytes: int = 2, tokens: int = 1) -> float:
    """Weight bytes a decode step of `tokens` tokens reads: every active parameter but an
    untied embedding table (looked up by row), in the served dtype, but the FP8 projections
    at one byte each plus their float32 scales."""
    unread = 0 if model.tie_word_embeddings else model.vocab_size * model.hidden_size
    served = active_params(model, tokens) - unread
    fp8 = 0.0
    for rows, cols, count in fp8_projections(model, tokens):
        served -= model.num_layers * count * rows * cols
        fp8 += model.num_layers * count * (rows * cols + _scale_bytes(model, rows, cols))
    return served * dtype_bytes + fp8


def kv_bytes_per_token(model: ModelConfig, dtype_bytes: int = 2) -> int:
    """Key and value of one token in every layer."""
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * dtype_bytes


@dataclass(frozen=True)
class Roofline:
    step_s: float  # the least time of one decode step
    tokens_per_s: float  # streams / step_s: one token per stream per step

    @classmethod
    def of(cls, model: ModelConfig, streams: int, mean_context: float, *,
           bytes_per_s: float, dtype_bytes: int = 2) -> Roofline:
        """The decode step of `streams` streams whose KV caches hold `mean_context` tokens
        on average."""
        read = (weight_bytes_per_step(model, dtype_bytes, tokens=streams)
                + streams * mean_context * kv_bytes_per_token(model, dtype_bytes))
        step = read / bytes_per_s
        return cls(step, streams / step)
