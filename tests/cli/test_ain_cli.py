"""``dprobust fit --config configs/ain/digits.yaml`` (W&B: config, metrics, example images) and ``dprobust attack
--attack AIN --ain ...``, with their one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_dprobust.cli import main
from tests.cli.test_main import dprobust
from tests.helpers import read_wandb_config_and_summary, read_wandb_history, wandb_run_file

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "ain" / "digits.yaml"
TINY = [
    "--trainer.max_epochs=2",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
    "--model.init_args.ifgsm_steps=3",
    "--model.init_args.ifgsm_alpha=0.07",
    "--model.init_args.decay_rate=-0.5",
    "--model.init_args.adaptive=false",
    '--model.init_args.generator_kwargs={"channels": [4, 4, 4, 4], "attention_channels": 4}',
]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ain")
    result = dprobust("fit", "--config", str(CONFIG), *TINY, cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder, result


def test_fit_logs_config_metrics_and_example_images_to_wandb(fitted):
    folder, result = fitted
    assert (
        "fit done: no DP (epsilon = inf)" in result.stdout and "trained down to bound" in result.stdout + result.stderr
    )
    run_file = wandb_run_file(folder / "runs/ain-digits")
    config, _ = read_wandb_config_and_summary(run_file)
    assert config["target_class"] == 8 and config["initial_bound"] == 0.8 and config["target"] == "mlp_tanh.erm_digits"
    rows = read_wandb_history(run_file)
    bounds = [row["ain/bound"] for row in rows if "ain/bound" in row]
    assert bounds == pytest.approx([0.8 * 2.718281828 ** (-0.5 * epoch) for epoch in (1, 2)], rel=1e-4)
    assert all(0 <= row["val/success"] <= 1 for row in rows if "val/success" in row)
    assert any("train/imitation" in row for row in rows)
    assert any(key.startswith("ain/examples") for row in rows for key in row)
    assert list(run_file.parent.glob("files/media/images/ain/examples_*.png"))
    assert len(list(folder.glob("runs/ain-digits/**/ain_examples/epoch_*.png"))) == 2


def test_attack_runs_a_trained_ain_checkpoint(fitted, tmp_path, capsys):
    folder, _ = fitted
    (ckpt,) = folder.glob("runs/ain-digits/**/last.ckpt")
    args = ["attack", "--ckpt_path", "mlp_tanh.erm_digits", "--attack", "AIN", "--attack", "FGSM", "--ain", str(ckpt)]
    small = ["--eps", "0.5", "--max_examples", "32", "--no-wandb", "--device", "cpu", "--out", str(tmp_path)]
    assert main([*args, *small]) == 0
    table = (tmp_path / "mlp_tanh.erm_digits" / "attack.md").read_text()
    assert "| AIN " in table and "| FGSM " in table


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--attack", "AIN"], "--ain must be a trained AIN"),
        (["--attack", "PGD", "--ain", "x.ckpt"], "--ain must be given only with --attack AIN"),
        (["--attack", "AIN", "--ain", "mlp_tanh.erm_digits"], "is a classifier, not an attack"),
    ],
)
def test_attack_refuses_a_missing_or_wrong_ain_with_one_line(extra, message, tmp_path, capsys):
    small = ["--eps", "0.5", "--max_examples", "8", "--no-wandb", "--device", "cpu", "--out", str(tmp_path)]
    assert main(["attack", "--ckpt_path", "mlp_tanh.erm_digits", *extra, *small]) == 2
    error = capsys.readouterr().err.strip()
    assert message in error and len(error.splitlines()) == 1
