"""What transformers' configuration class of each architecture assumes for a key that
config.json leaves out: the one table the config.json readers (hf_config, hf_rope,
hf_attention, hf_moe) fill absent keys from, checked entry by entry against the classes
themselves (tests/test_hf_defaults_reference.py, transformers 5.25).

The architectures differ where it matters: Mixtral's rope theta is 1e6 and its RMSNorm
epsilon 1e-5 (MixtralConfig), every other's 10000 and 1e-6. One value for all of them served
a Mixtral checkpoint without `rope_theta` with the wrong rotary frequencies: no token of 30
matched.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HFDefaults:
    rms_norm_eps: float
    rope_theta: float  # also for a rope_parameters / rope_scaling without one
    max_position_embeddings: int
    # None: num_attention_heads (Llama's default is no default: it follows the heads).
    num_key_value_heads: int | None
    # None: hidden_size // num_attention_heads.
    head_dim: int | None = None
    # The window where the architecture applies one and the key is absent (Qwen's only with
    # use_sliding_window); None: no window.
    sliding_window: int | None = None
    # Qwen2 / Qwen3: the first layer of the window when layer_types does not say.
    max_window_layers: int | None = None
    # Mixture of Experts (None for a dense architecture, and for Mixtral's expert width,
    # which is its intermediate_size, a key every config.json must hold).
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    norm_topk_prob: bool | None = None


HF_DEFAULTS: dict[str, HFDefaults] = {
    "llama": HFDefaults(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=2048,
                        num_key_value_heads=None),
    "mistral": HFDefaults(rms_norm_eps=1e-6, rope_theta=10000.0,
                          max_position_embeddings=4096 * 32, num_key_value_heads=8,
                          sliding_window=4096),
    "qwen2": HFDefaults(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=32768,
                        num_key_value_heads=32, sliding_window=4096, max_window_layers=28),
    "qwen3": HFDefaults(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=32768,
                        num_key_value_heads=32, head_dim=128, sliding_window=4096,
                        max_window_layers=28),
    "qwen3_moe": HFDefaults(rms_norm_eps=1e-6, rope_theta=10000.0,
                            max_position_embeddings=32768, num_key_value_heads=4,
                            sliding_window=4096, num_experts=128, num_experts_per_tok=8,
                            moe_intermediate_size=768, norm_topk_prob=False),
    "mixtral": HFDefaults(rms_norm_eps=1e-5, rope_theta=1e6, max_position_embeddings=4096 * 32,
                          num_key_value_heads=8, num_experts=8, num_experts_per_tok=2),
}
