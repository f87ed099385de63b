"""Named model shapes.

Kernel compilation depends on shapes and dtypes, not on weight values, so a preset with a real
model's shapes and random weights compiles exactly the kernels that model would.
"""

from __future__ import annotations

from typing import Any

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
    # Llama-3.2-1B's shapes (config.json of meta-llama/Llama-3.2-1B).
    "llama-3.2-1b": dict(
        vocab_size=128256,
        hidden_size=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        max_model_len=8192,
        tie_word_embeddings=True,
    ),
    # Llama-3.1-8B's shapes.
    "llama-3.1-8b": dict(
        vocab_size=128256,
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        max_model_len=8192,
        tie_word_embeddings=False,
    ),
}


def preset_names() -> list[str]:
    return sorted(MODEL_PRESETS)
