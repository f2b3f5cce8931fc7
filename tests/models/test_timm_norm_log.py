"""timm's BatchNorm -> GroupNorm swap is said once, at model creation, and documented in docs/sharp_edges.md."""

from __future__ import annotations

import logging
from pathlib import Path

from lightning_dprobust.models.timm_models import create_timm_model

ROOT = Path(__file__).resolve().parents[2]


def test_the_norm_swap_is_logged_once_per_model(caplog):
    with caplog.at_level(logging.WARNING, logger="lightning_dprobust.models.timm_models"):
        create_timm_model("resnet10t", num_classes=10, in_chans=1)
    lines = [record.getMessage() for record in caplog.records if "GroupNorm" in record.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("timm resnet10t: ") and "BatchNorm layer(s) replaced" in lines[0]


def test_a_model_without_batchnorm_says_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="lightning_dprobust.models.timm_models"):
        create_timm_model("vit_tiny_patch16_224", num_classes=10, in_chans=1, img_size=32, patch_size=8)
    assert not [record for record in caplog.records if "GroupNorm" in record.getMessage()]


def test_the_swap_is_documented_in_sharp_edges():
    text = (ROOT / "docs" / "sharp_edges.md").read_text()
    assert "timm" in text and "replaced by GroupNorm" in text and "logged once" in text
