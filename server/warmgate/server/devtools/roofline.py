"""The HBM roofline of a decode step: the least time a step can take when every byte it must
read comes from device memory at the memory's bandwidth.

A decode step reads every weight once (the vocabulary head in full; an untied embedding table
only by the rows it looks up, which this leaves out) and the KV cache of every token each
stream attends to. At batch sizes where serving is memory-bound (decode, up to a few hundred
streams on an H200), a step cannot beat this, and a step's time over it says how much of the
hardware the engine uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmgate.server.config.runner_config import ModelConfig

# H200: 4.8 TB/s HBM3e (NVIDIA's figure; a device-to-device copy measures about 4.3 TB/s).
H200_HBM_BYTES_PER_S = 4.8e12


def layer_params(model: ModelConfig) -> int:
    """Parameters of one decoder layer: attention projections, MLP, the two norms."""
    h, hd = model.hidden_size, model.head_dim
    q = h * model.num_heads * hd
    kv = 2 * h * model.num_kv_heads * hd
    o = model.num_heads * hd * h
    mlp = 3 * h * model.intermediate_size
    bias = (model.num_heads + 2 * model.num_kv_heads) * hd if model.qkv_bias else 0
    qk_norm = 2 * hd if model.qk_norm else 0
    return q + kv + o + mlp + 2 * h + bias + qk_norm


def num_params(model: ModelConfig) -> int:
    """Every parameter, the embedding table once when the head is tied to it."""
    embed = model.vocab_size * model.hidden_size
    head = 0 if model.tie_word_embeddings else embed
    return model.num_layers * layer_params(model) + embed + head + model.hidden_size


def weight_bytes_per_step(model: ModelConfig, dtype_bytes: int = 2) -> int:
    """Weight bytes a decode step reads: all but an untied embedding table."""
    unread = 0 if model.tie_word_embeddings else model.vocab_size * model.hidden_size
    return (num_params(model) - unread) * dtype_bytes


def kv_bytes_per_token(model: ModelConfig, dtype_bytes: int = 2) -> int:
    """Key and value of one token in every layer."""
    return 2 * model.num_layers * model.num_kv_heads * model.head_dim * dtype_bytes


@dataclass(frozen=True)
class Roofline:
    step_s: float  # the least time of one decode step
    tokens_per_s: float  # streams / step_s: one token per stream per step

    @classmethod
    def of(cls, model: ModelConfig, streams: int, mean_context: float, *,
           bytes_per_s: float = H200_HBM_BYTES_PER_S, dtype_bytes: int = 2) -> Roofline:
        """The decode step of `streams` streams whose KV caches hold `mean_context` tokens
        on average."""
        read = (weight_bytes_per_step(model, dtype_bytes)
                + streams * mean_context * kv_bytes_per_token(model, dtype_bytes))
        step = read / bytes_per_s
        return cls(step, streams / step)
