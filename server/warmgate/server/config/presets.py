"""Named model shapes.

Kernel compilation depends on shapes and dtypes, not on weight values, so a preset with a real
model's shapes and random weights compiles exactly the kernels that model would.
"""

from __future__ import annotations

from typing import Any

from warmgate.server.config.fp8_config import FP8Config
from warmgate.server.config.rope_config import RopeConfig

# Llama 3.1/3.2's rope_scaling ({"rope_type": "llama3", ...} in their config.json).
_LLAMA3_ROPE: dict[str, Any] = dict(rope_type="llama3", theta=500000.0, low_freq_factor=1.0,
                    high_freq_factor=4.0, original_max_position_embeddings=8192)

# Fields are ModelConfig's; anything left out takes ModelConfig's default.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # Small enough that a full warmup on a 2-core CPU takes seconds.
    "tiny": dict(
        vocab_size=512,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=128,
        max_model_len=512,
    ),
    # Llama-3.2-1B's shapes and rope (config.json of meta-llama/Llama-3.2-1B).
    "llama-3.2-1b": dict(
        vocab_size=128256,
        hidden_size=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=8192,
        rope=RopeConfig(factor=32.0, **_LLAMA3_ROPE),
        rms_norm_eps=1e-5,
        max_model_len=8192,
        tie_word_embeddings=True,
    ),
    # Llama-3.1-8B's shapes and rope (config.json of meta-llama/Llama-3.1-8B).
    "llama-3.1-8b": dict(
        vocab_size=128256,
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        rope=RopeConfig(factor=8.0, **_LLAMA3_ROPE),
        rms_norm_eps=1e-5,
        max_model_len=8192,
        tie_word_embeddings=False,
    ),
    # Qwen3-0.6B (config.json of Qwen/Qwen3-0.6B): head_dim 128 is not hidden / heads.
    "qwen3-0.6b": dict(
        architecture="qwen3",
        vocab_size=151936,
        hidden_size=1024,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=3072,
        rope=RopeConfig(theta=1000000.0),
        rms_norm_eps=1e-6,
        max_model_len=8192,
        tie_word_embeddings=True,
    ),
    # Qwen2.5-1.5B (config.json of Qwen/Qwen2.5-1.5B-Instruct; use_sliding_window false).
    "qwen2.5-1.5b": dict(
        architecture="qwen2",
        vocab_size=151936,
        hidden_size=1536,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        head_dim=128,
        intermediate_size=8960,
        rope=RopeConfig(theta=1000000.0),
        rms_norm_eps=1e-6,
        max_model_len=8192,
        tie_word_embeddings=True,
    ),
    # Mistral-7B v0.3 (config.json of mistralai/Mistral-7B-Instruct-v0.3: sliding_window null,
    # rope_theta 1e6; v0.1's 4096-token window is not supported).
    "mistral-7b": dict(
        architecture="mistral",
        vocab_size=32768,
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        rope=RopeConfig(theta=1000000.0),
        rms_norm_eps=1e-5,
        max_model_len=8192,
        tie_word_embeddings=False,
    ),
    # Qwen3-30B-A3B (config.json of Qwen/Qwen3-30B-A3B): Qwen3's attention, every layer a MoE
    # of 128 experts, 8 per token, renormalised; intermediate_size is read by no layer.
    "qwen3-30b-a3b": dict(
        architecture="qwen3_moe",
        vocab_size=151936,
        hidden_size=2048,
        num_layers=48,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=6144,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        norm_topk_prob=True,
        rope=RopeConfig(theta=1000000.0),
        rms_norm_eps=1e-6,
        max_model_len=8192,
        tie_word_embeddings=False,
    ),
    # Mixtral-8x7B (config.json of mistralai/Mixtral-8x7B-Instruct-v0.1: sliding_window null):
    # Mistral's attention, 8 experts of 14336, 2 per token. bf16 fits one H200 (93 GB).
    "mixtral-8x7b": dict(
        architecture="mixtral",
        vocab_size=32000,
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=14336,
        norm_topk_prob=True,
        rope=RopeConfig(theta=1000000.0),
        rms_norm_eps=1e-5,
        max_model_len=8192,
        tie_word_embeddings=False,
    ),
}
# FP8 versions of the above, in the formats their published FP8 checkpoints use: Llama-3.1-8B
# as compressed-tensors with one scale per weight tensor (activations quantized per token on
# the fly), the head left in bf16; Qwen3-30B-A3B-FP8's 128x128 blocks (router, head in bf16).
MODEL_PRESETS["llama-3.1-8b-fp8"] = {**MODEL_PRESETS["llama-3.1-8b"], "fp8": FP8Config(
    scheme="tensor", fmt="compressed-tensors", ignore=("lm_head",))}
MODEL_PRESETS["qwen3-30b-a3b-fp8"] = {**MODEL_PRESETS["qwen3-30b-a3b"], "fp8": FP8Config(
    scheme="block", fmt="fp8", ignore=())}


# Each preset's max_position_embeddings (the same config.json files as above): --max-model-len
# may raise a preset's default length up to this and no further, as a model directory's is
# checked against its file. Past it, the rope cache and the KV cache would grow with a length
# the model was never meant to serve. tiny is no real model: its limit is ours, long enough
# for a test's long stream, far below a length whose caches would not fit.
PRESET_MAX_POSITIONS: dict[str, int] = {
    "tiny": 32768,
    "llama-3.2-1b": 131072,
    "llama-3.1-8b": 131072,
    "qwen3-0.6b": 40960,
    "qwen2.5-1.5b": 32768,
    "mistral-7b": 32768,
    "qwen3-30b-a3b": 40960,
    "mixtral-8x7b": 32768,
    "llama-3.1-8b-fp8": 131072,
    "qwen3-30b-a3b-fp8": 40960,
}


def preset_names() -> list[str]:
    return sorted(MODEL_PRESETS)
