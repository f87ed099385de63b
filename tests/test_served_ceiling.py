"""The served ceiling (devtools/served_ceiling.py): a steady step's projections and attention,
each at the longer of its FLOPs at the card's peak and its bytes at the bandwidth."""

from __future__ import annotations

import pytest

from warmgate.server.config.runner_config import ModelConfig
from warmgate.server.devtools.gpu_card import KNOWN_CARDS, PEAK_BF16_FLOPS
from warmgate.server.devtools.roofline import Roofline
from warmgate.server.devtools.served_ceiling import ServedCeiling, projection_flops_per_token

H100_BYTES, H100_FLOPS = 3.35e12, 989e12


def test_the_8b_projections_are_its_published_shapes_counted_by_hand() -> None:
    # Llama-3.1-8B: q and o 4096 x 4096, k and v 1024 x 4096, gate, up and down 14336 x 4096.
    per_layer = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096
    assert projection_flops_per_token(ModelConfig.from_preset("llama-3.1-8b")) == (
        2 * 32 * per_layer)


def test_the_8b_at_128_streams_of_512_and_256_tokens_by_hand() -> None:
    model = ModelConfig.from_preset("llama-3.1-8b")
    ceiling = ServedCeiling.of(model, 128, 512, 256, bytes_per_s=H100_BYTES,
                               flops_per_s=H100_FLOPS)
    assert ceiling.prompt_tokens_per_step == 256  # half a prompt a step
    # 384 rows at 2 x 6.98e9 FLOPs, and 128.5 logits rows of the 128256 x 4096 head, are
    # compute-bound: 5.56 ms, longer than the 15 GB of weights' 4.48 ms.
    flops = 384 * 2 * 32 * 218_103_808 + 128.5 * 2 * 128256 * 4096
    assert ceiling.projections_s == pytest.approx(flops / H100_FLOPS)
    assert ceiling.projections_s == pytest.approx(5.56e-3, rel=1e-2)
    # 128 x 640 cached tokens of 128 KiB each and 256 new ones, memory-bound: 3.2 ms.
    assert ceiling.attention_s == pytest.approx((128 * 640 + 256) * 131072 / H100_BYTES)
    assert ceiling.tokens_per_s == pytest.approx(128 / (ceiling.projections_s
                                                        + ceiling.attention_s))
    assert 14_000 < ceiling.tokens_per_s < 15_000


@pytest.mark.parametrize("preset", ["llama-3.2-1b", "llama-3.1-8b", "qwen3-30b-a3b"])
def test_without_prompts_a_memory_bound_step_is_the_decode_roofline(preset: str) -> None:
    model = ModelConfig.from_preset(preset)
    ceiling = ServedCeiling.of(model, 8, 0, 256, bytes_per_s=H100_BYTES,
                               flops_per_s=H100_FLOPS)
    roofline = Roofline.of(model, 8, 128, bytes_per_s=H100_BYTES)
    assert ceiling.step_s == pytest.approx(roofline.step_s, rel=1e-3)


@pytest.mark.parametrize("streams", [1, 8, 128])
@pytest.mark.parametrize("preset", ["llama-3.2-1b", "llama-3.1-8b", "qwen3-30b-a3b"])
def test_the_ceiling_is_never_above_the_decode_roofline(preset: str, streams: int) -> None:
    model = ModelConfig.from_preset(preset)
    ceiling = ServedCeiling.of(model, streams, 512, 256, bytes_per_s=H100_BYTES,
                               flops_per_s=H100_FLOPS)
    roofline = Roofline.of(model, streams, 640, bytes_per_s=H100_BYTES)
    assert ceiling.tokens_per_s < roofline.tokens_per_s


def test_longer_prompts_lower_the_ceiling() -> None:
    model = ModelConfig.from_preset("llama-3.2-1b")
    figures = [ServedCeiling.of(model, 128, p, 256, bytes_per_s=H100_BYTES,
                                flops_per_s=H100_FLOPS).tokens_per_s for p in (0, 128, 512, 2048)]
    assert figures == sorted(figures, reverse=True) and len(set(figures)) == 4


def test_every_known_card_has_a_peak_and_fp8_weights_are_refused() -> None:
    assert {slug for _, slug, _, _ in KNOWN_CARDS} == set(PEAK_BF16_FLOPS)
    assert all(peak > 0 for peak in PEAK_BF16_FLOPS.values())
    assert PEAK_BF16_FLOPS["h100"] == PEAK_BF16_FLOPS["h200"] == H100_FLOPS
    with pytest.raises(ValueError, match="FP8"):
        ServedCeiling.of(ModelConfig.from_preset("llama-3.1-8b-fp8"), 8, 512, 256,
                         bytes_per_s=H100_BYTES, flops_per_s=H100_FLOPS)
