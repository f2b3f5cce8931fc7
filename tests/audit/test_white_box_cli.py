"""``dprobust audit --white_box``: the white-box bound printed next to the black-box bound and the claimed epsilon."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_dprobust.cli import main

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "dpsgd" / "digits.yaml")


def test_cli_white_box_audit_prints_both_bounds_and_the_claim(tmp_path, capsys):
    argv = ["audit", "--config", CONFIG, "--white_box", "--gradient_canaries", "100", "--canaries", "20"]
    assert main([*argv, "--epochs", "1", "--out", str(tmp_path), "--no-wandb"]) == 0
    printed = capsys.readouterr().out
    assert "claimed epsilon: 2.9" in printed or "claimed epsilon: 3.0" in printed
    assert "empirical lower bounds: white-box " in printed and ", black-box " in printed
    written = (tmp_path / "audit.md").read_text()
    assert "| white-box (gradient canaries" in written and "| black-box (mislabeled canaries) | 20 |" in written


@pytest.mark.parametrize(
    "flags",
    [
        ["--white_box"],
        ["--config", CONFIG, "--white_box", "--no_dp"],
        ["--config", CONFIG, "--white_box", "--gradient_canaries", "1"],
        ["--ckpt_path", "model.ckpt", "--config", CONFIG, "--white_box"],
    ],
)
def test_cli_white_box_bad_flags_exit_2_with_a_one_line_message(flags, tmp_path, capsys):
    assert main(["audit", *flags, "--out", str(tmp_path), "--no-wandb"]) == 2
    assert capsys.readouterr().err.startswith("dprobust: error:")
