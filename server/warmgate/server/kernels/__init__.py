"""Triton kernels for the built-in runner, one module per kernel family.

Importing this package imports triton; the runner only does so when the `triton` backend or
`TritonOps` is asked for.
"""

from __future__ import annotations

from warmgate.server.kernels.activation import silu_and_mul
from warmgate.server.kernels.decode_attention import choose_num_splits, paged_attention_decode
from warmgate.server.kernels.fused_moe import fused_moe
from warmgate.server.kernels.kv_cache import reshape_and_cache
from warmgate.server.kernels.rms_norm import rms_norm
from warmgate.server.kernels.rope_cache import rope_and_cache
from warmgate.server.kernels.rotary import rotary_embedding
from warmgate.server.kernels.varlen_attention import paged_attention_varlen

__all__ = [
    "choose_num_splits",
    "fused_moe",
    "paged_attention_decode",
    "paged_attention_varlen",
    "reshape_and_cache",
    "rms_norm",
    "rope_and_cache",
    "rotary_embedding",
    "silu_and_mul",
]
