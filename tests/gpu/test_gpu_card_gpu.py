"""The card this GPU machine has is one the roofline table knows, and a device-to-device copy
reaches a plausible share of its figure (0.6-1.0: HBM copies run at about 0.8-0.9)."""

from __future__ import annotations

import pytest
import torch

from warmgate.server.devtools.gpu_card import detect

pytestmark = pytest.mark.gpu


def test_the_card_is_known_and_its_copy_agrees_with_its_figure() -> None:
    card = detect("cuda")
    assert card.table_bytes_per_s is not None, f"{torch.cuda.get_device_name()} is not known"
    assert card.copy_bytes_per_s is not None
    assert 0.6 <= card.copy_bytes_per_s / card.table_bytes_per_s <= 1.0, card.describe()
