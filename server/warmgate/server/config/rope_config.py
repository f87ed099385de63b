"""Rotary position embedding settings: which frequency schedule, and its parameters.

Torch-free so runner_config.py can hold it; runner.rope turns it into frequencies. The four
rope types are the ones transformers' Llama, Mistral, Qwen2 and Qwen3 checkpoints use:
"default" (plain RoPE), "linear" (positions divided by `factor`), "llama3" (Llama 3.1+
band-wise scaling) and "yarn" (NTK-by-parts interpolation plus a cos/sin attention factor).
"""

from __future__ import annotations

from dataclasses import dataclass

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class RopeError(ValueError):
    """A rope setting is missing or out of range; `key` is the setting's config.json name."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


@dataclass(frozen=True)
class RopeConfig:
    rope_type: str = "default"
    theta: float = 10000.0
    # linear, llama3, yarn: how much longer the served context is than the trained one.
    # yarn may leave it None in config.json; the reader then derives it (as transformers does).
    factor: float = 1.0
    # llama3: the wavelength bands left alone (short) and fully scaled (long).
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    # llama3, yarn: the context length the model was pre-trained with.
    original_max_position_embeddings: int | None = None
    # yarn: the rotation counts bounding the interpolation ramp, whether the ramp's ends are
    # rounded to whole dimensions, and the cos/sin scale (None: derived from factor/mscale).
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None

    def __post_init__(self) -> None:
        def need(ok: bool, key: str, message: str) -> None:
            if not ok:
                raise RopeError(key, message)

        need(self.rope_type in ROPE_TYPES, "rope_type",
             f"{self.rope_type!r} is not implemented; supported: {', '.join(ROPE_TYPES)}")
        need(self.theta > 0, "rope_theta", f"must be > 0, got {self.theta}")
        if self.rope_type == "default":
            return
        need(self.factor > 0, "factor", f"must be > 0, got {self.factor}")
        if self.rope_type in ("llama3", "yarn"):
            need(self.original_max_position_embeddings is not None
                 and self.original_max_position_embeddings >= 1,
                 "original_max_position_embeddings", f"{self.rope_type} needs a value >= 1")
        if self.rope_type == "llama3":
            need(0 < self.low_freq_factor < self.high_freq_factor, "low_freq_factor",
                 f"needs 0 < low_freq_factor ({self.low_freq_factor}) < high_freq_factor "
                 f"({self.high_freq_factor})")
        if self.rope_type == "yarn":
            need(self.attention_factor is None or self.attention_factor > 0, "attention_factor",
                 f"must be > 0, got {self.attention_factor}")
