"""The card a bench runs on and the bandwidth its rooflines divide by: the table finds each
card by the name its driver reports (the most specific entry first), an unknown card gets a
file-safe name and the copy it measures, and the CPU's copy is measured for a CPU run."""

from __future__ import annotations

import pytest

from warmgate.server.devtools.gpu_card import Card, detect, known_card


@pytest.mark.parametrize(("driver_name", "slug", "tbps"), [
    ("NVIDIA H100 80GB HBM3", "h100", 3.35),
    ("NVIDIA H200", "h200", 4.8),
    ("NVIDIA H100 NVL", "h100-nvl", 3.9),
    ("NVIDIA H100 PCIe", "h100-pcie", 2.0),
    ("NVIDIA GH200 480GB", "gh200", 4.0),
    ("NVIDIA GH200 144G HBM3e", "gh200-144gb", 4.9),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb", 2.039),
    ("NVIDIA A100-SXM4-40GB", "a100", 1.555),
])
def test_known_cards_by_their_driver_names(driver_name: str, slug: str, tbps: float) -> None:
    found, bandwidth = known_card(driver_name)
    assert found == slug
    assert bandwidth is not None and bandwidth == pytest.approx(tbps * 1e12)


def test_an_unknown_card_is_named_from_its_driver_name_and_measured() -> None:
    assert known_card("NVIDIA RTX PRO 6000 Blackwell") == ("rtx-pro-6000-blackwell", None)
    card = Card("NVIDIA RTX PRO 6000 Blackwell", "rtx-pro-6000-blackwell", None, 1.5e12)
    assert card.bytes_per_s == 1.5e12
    assert "not a known card" in card.describe() and "the roofline uses it" in card.describe()
    with pytest.raises(ValueError, match="not a known card"):
        _ = Card("x", "x", None, None).bytes_per_s


def test_a_known_card_divides_by_its_figure_and_prints_the_copy_against_it() -> None:
    card = Card("NVIDIA H100 80GB HBM3", "h100", 3.35e12, 2.9e12)
    assert card.bytes_per_s == 3.35e12
    assert card.describe() == ("card: NVIDIA H100 80GB HBM3 (h100): roofline bandwidth 3.35 "
                               "TB/s (known card); device-to-device copy 2.90 TB/s (0.87 of it)")


def test_a_cpu_run_measures_its_memory_copy() -> None:
    card = detect("cpu")
    assert card.slug == "cpu" and card.table_bytes_per_s is None
    assert card.copy_bytes_per_s is not None and 1e8 < card.copy_bytes_per_s < 1e13
    assert card.bytes_per_s == card.copy_bytes_per_s
