"""Rotary frequencies for every rope type, computed the way transformers computes them.

`rope_frequencies` returns the per-pair inverse frequencies and the factor cos and sin are
multiplied by (1 except for yarn). The frequencies are computed in float32 in the reference's
order of operations: the checkpoint was trained with exactly those rounded values, and
matching them bit for bit keeps greedy tokens identical to the reference's.
"""

from __future__ import annotations

import math

import torch

from warmgate.server.config.rope_config import RopeConfig


def _base_inv_freq(theta: float, head_dim: int) -> torch.Tensor:
    """[head_dim / 2] float32: theta ** (-2i / head_dim)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta ** exponents)


def _llama3(rope: RopeConfig, inv_freq: torch.Tensor) -> torch.Tensor:
    """Long wavelengths (beyond the trained context / low_freq_factor) are slowed by `factor`,
    short ones (below context / high_freq_factor) kept, the band between blended smoothly."""
    assert rope.original_max_position_embeddings is not None  # RopeConfig checks it
    context = rope.original_max_position_embeddings
    low_freq_wavelen = context / rope.low_freq_factor
    high_freq_wavelen = context / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = ((context / wavelen - rope.low_freq_factor)
              / (rope.high_freq_factor - rope.low_freq_factor))
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(rope: RopeConfig) -> float:
    if rope.attention_factor is not None:
        return rope.attention_factor
    if rope.mscale and rope.mscale_all_dim:
        return float(_yarn_mscale(rope.factor, rope.mscale)
                     / _yarn_mscale(rope.factor, rope.mscale_all_dim))
    return _yarn_mscale(rope.factor)


def _yarn(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Dimensions that rotate many times over the trained context keep their frequency
    (extrapolation), those that rotate less than once are divided by `factor`
    (interpolation); a linear ramp in dimension index joins the two."""
    assert rope.original_max_position_embeddings is not None  # RopeConfig checks it
    context = rope.original_max_position_embeddings

    def correction_dim(num_rotations: float) -> float:
        return ((head_dim * math.log(context / (num_rotations * 2 * math.pi)))
                / (2 * math.log(rope.theta)))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    pos_freqs = rope.theta ** (torch.arange(0, head_dim, 2).to(torch.float32) / head_dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (rope.factor * pos_freqs)
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low),
                       0, 1)
    keep = 1 - ramp  # 1: keep the trained frequency; 0: fully interpolated
    return interpolation * (1 - keep) + extrapolation * keep


def rope_frequencies(rope: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim / 2] float32 on the CPU, cos/sin scale)."""
    if rope.rope_type == "yarn":
        return _yarn(rope, head_dim), yarn_attention_factor(rope)
    inv_freq = _base_inv_freq(rope.theta, head_dim)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor, 1.0
    if rope.rope_type == "llama3":
        return _llama3(rope, inv_freq), 1.0
    if rope.rope_type == "default":
        return inv_freq, 1.0
    raise ValueError(f"rope_type {rope.rope_type!r} has no frequency schedule")


# Positions per step of the cache build: the float64 angles and their cos and sin exist for
# one chunk at a time, so the build peaks at the float32 cache plus a few MiB, not at five
# times the cache (a 16M-position cache would otherwise pass through about 40 GB).
CACHE_CHUNK_POSITIONS = 32768


def cos_sin_cache(max_position: int, head_dim: int, rope: RopeConfig,
                  device: torch.device | str = "cpu",
                  chunk: int = CACHE_CHUNK_POSITIONS) -> torch.Tensor:
    """[max_position, head_dim] float32: cos of every (position, frequency) in the first half,
    sin in the second, times the rope's attention factor. The angles are float64: at position
    8k a float32 product loses the low bits of the phase. Each element is computed as a
    whole-cache build would, so the chunk size does not change a bit."""
    inv_freq, scale = rope_frequencies(rope, head_dim)  # [half] float32
    inv = inv_freq.to(device=device, dtype=torch.float64)
    half = inv.shape[0]
    out = torch.empty((max_position, 2 * half), dtype=torch.float32, device=device)
    for start in range(0, max_position, chunk):
        stop = min(start + chunk, max_position)
        freqs = torch.outer(torch.arange(start, stop, dtype=torch.float64, device=device), inv)
        out[start:stop, :half] = freqs.cos() * scale
        out[start:stop, half:] = freqs.sin() * scale
    return out
