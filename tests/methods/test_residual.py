"""ResidualPerturbation: training by Trainer.fit and the CLI, nominal privacy, checkpoints, DDP, bad inputs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lightning_dprobust.callbacks.run import fit_summary
from lightning_dprobust.cli import main as dprobust
from lightning_dprobust.cli.loading import load_classifier
from lightning_dprobust.core.residual_privacy import theorem1_epsilon
from lightning_dprobust.data import DigitsDataModule
from lightning_dprobust.methods import ResidualPerturbation
from lightning_dprobust.methods.residual import NOMINAL_SOURCE
from lightning_dprobust.recipes import Recipe
from tests.helpers import digits, quiet_trainer, run_ranks, wandb_run_file

ROOT = Path(__file__).resolve().parents[2]


def module(**kwargs):
    return ResidualPerturbation(num_classes=10, input_shape=(1, 8, 8), **kwargs)


def test_fit_learns_and_records_nominal_epsilon_apart(tmp_path, caplog):
    torch.manual_seed(0)
    rp = module(gamma=0.3, lr=0.1, momentum=0.9)
    trainer = quiet_trainer(tmp_path, max_epochs=3, limit_val_batches=None)
    with caplog.at_level("INFO"):
        trainer.fit(rp, digits(batch_size=128))
    logged = trainer.callback_metrics["privacy/nominal_epsilon"].item()
    accuracy = trainer.validate(rp, digits(batch_size=128), verbose=False)[0]["val/acc"]
    assert accuracy > 0.5
    assert rp.examples_seen == 3 * 1293
    [claim] = rp.ledger.nominal
    expected = theorem1_epsilon(0.3, 3.0, 1e-5, 30.0, input_noise=0.15, bound_r=30.0)
    assert (claim.source, claim.epsilon) == (NOMINAL_SOURCE, pytest.approx(expected))
    assert rp.ledger.history == () and rp.ledger.epsilon(1e-5) == math.inf
    assert logged == pytest.approx(expected, rel=1e-6)
    nominal = f"no DP guarantee; nominal epsilon {expected:.4g} at delta 1e-05 ({NOMINAL_SOURCE})"
    assert f"{nominal}: a heuristic proof, NOT a differential-privacy guarantee" in caplog.text
    assert fit_summary(trainer, None).startswith(f"fit done: {nominal}; ")


def test_default_input_noise_and_strategy_two_has_no_training_claim():
    assert module(gamma=0.8).model.net.members[0].input_noise == 0.4
    strategy_two = module(strategy="multiplicative", gamma=2.0)
    assert strategy_two.model.net.members[0].input_noise == 0.0
    assert strategy_two.nominal_epsilon(10.0) == math.inf


def test_members_have_their_own_initialization_and_noise():
    rp = module(gamma=0.5, ensemble_size=3).eval()
    weights = [m.model.net.conv.weight for m in rp.model.net.members]
    assert not torch.equal(weights[0], weights[1]) and not torch.equal(weights[1], weights[2])
    x = torch.rand(2, 1, 8, 8)
    assert not torch.equal(rp(x), rp(x))


def short_fit(run: Path, train_batches: int, val_batches: int, **model_args) -> list[str]:
    """``dprobust fit`` of the digits residual config for one short epoch into ``run``, an En2 ensemble; the epoch
    count is argument 4, so a resume can replace it."""
    args = ["fit", "--config", str(ROOT / "configs/residual/digits.yaml"), "--trainer.max_epochs", "1"]
    args += [
        "--trainer.logger",
        "false",
        "--trainer.default_root_dir",
        str(run),
        "--trainer.enable_progress_bar",
        "false",
    ]
    args += ["--trainer.limit_train_batches", str(train_batches), "--trainer.limit_val_batches", str(val_batches)]
    for key, value in {"ensemble_size": 2, **model_args}.items():
        args += [f"--model.init_args.{key}", str(value)]
    return args


def test_cli_fit_checkpoint_reloads_and_resume_keeps_nominal_ledger(tmp_path):
    run = tmp_path / "run"
    args = short_fit(run, train_batches=3, val_batches=1)
    assert dprobust(args) == 0
    ckpt = next(run.rglob("last.ckpt"))
    checkpoint = torch.load(ckpt, weights_only=True)
    first = checkpoint["privacy_ledger"]["nominal"][0]
    assert checkpoint["examples_seen"] == 3 * 128
    model = load_classifier(str(ckpt))
    assert isinstance(model, ResidualPerturbation) and len(model.model.net.members) == 2
    shadow_recipe = Recipe.from_module(model, DigitsDataModule(), 128, 1).config["model"]["init_args"]
    assert (shadow_recipe["ensemble_size"], shadow_recipe["strategy"], shadow_recipe["gamma"]) == (2, "additive", 0.3)
    assert model.ledger.nominal[0].epsilon == first[1]
    assert dprobust([*args[:4], "2", *args[5:], "--ckpt_path", str(ckpt)]) == 0
    resumed = torch.load(next(run.rglob("last.ckpt")), weights_only=True)
    assert resumed["examples_seen"] == 6 * 128 and resumed["privacy_ledger"]["nominal"][0][1] > first[1]


def _launch(out_dir: Path, devices: int, batch_size: int) -> list[dict]:
    out_dir.mkdir()
    return run_ranks(Path(__file__).with_name("residual_ddp_run.py"), out_dir, devices, batch_size)


@pytest.mark.slow
def test_two_gloo_ranks_stay_identical_with_their_own_noise(tmp_path):
    ranks = _launch(tmp_path / "ddp", 2, 64)
    single = _launch(tmp_path / "single", 1, 128)[0]
    assert ranks[0]["world_size"] == 2
    assert torch.equal(ranks[0]["params"], ranks[1]["params"])
    assert not torch.equal(ranks[0]["params"], ranks[0]["initial"])
    assert not torch.equal(ranks[0]["probe"], ranks[1]["probe"])
    assert ranks[0]["nominal"] == ranks[1]["nominal"]
    assert ranks[0]["examples_seen"] == single["examples_seen"] == 4 * 128
    assert ranks[0]["nominal"][0][1] == pytest.approx(single["nominal"][0][1], rel=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ensemble_size": 0}, "ensemble_size"),
        ({"gamma": -0.1}, "gamma"),
        ({"strategy": "both"}, "strategy"),
        ({"model": "cnn_tanh"}, "CNNTanh has no residual block"),
        ({"combine": "vote"}, "combine"),
    ],
)
def test_bad_arguments_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        module(**kwargs)
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_dprobust_audit_runs_on_an_ensemble_checkpoint_with_shadows_like_it(tmp_path):
    run = tmp_path / "run"
    fit = short_fit(run, train_batches=2, val_batches=0, gamma=0.6)
    assert dprobust(fit) == 0
    ckpt = next(run.rglob("last.ckpt"))
    recipe = Recipe.from_module(load_classifier(str(ckpt)), DigitsDataModule(), 128, 1).config["model"]["init_args"]
    assert recipe["ensemble_size"] == 2 and recipe["gamma"] == 0.6
    args = [
        "audit",
        "--ckpt",
        str(ckpt),
        "--shadows",
        "1",
        "--attack",
        "loss",
        "--attack",
        "shadow",
        "--epochs",
        "1",
        "--out",
        str(tmp_path / "audit"),
        "--no-wandb",
    ]
    assert dprobust(args) == 0
    assert "shadow" in (tmp_path / "audit" / "audit.md").read_text()


@pytest.mark.slow
def test_cli_fit_logs_the_nominal_epsilon_to_wandb(tmp_path):
    from tests.cli.test_main import dprobust as run_dprobust
    from tests.helpers import read_wandb_history

    result = run_dprobust(
        "fit",
        "--config",
        str(ROOT / "configs/residual/digits.yaml"),
        "--trainer.max_epochs",
        "1",
        "--trainer.limit_train_batches",
        "2",
        "--model.init_args.ensemble_size",
        "1",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "NOT a differential-privacy guarantee" in result.stderr + result.stdout
    assert "fit done: no DP guarantee; nominal epsilon" in result.stdout
    run_file = wandb_run_file(tmp_path / "runs/residual-digits")
    logged = [
        row["privacy/nominal_epsilon"] for row in read_wandb_history(run_file) if "privacy/nominal_epsilon" in row
    ]
    expected = theorem1_epsilon(0.3, 2 * 128 / 1293, 1e-5, 30.0, input_noise=0.15, bound_r=30.0)
    assert logged == [pytest.approx(expected, rel=1e-6)]
    assert not any("privacy/epsilon" in row for row in read_wandb_history(run_file))


@pytest.mark.parametrize("name", ["residual_perturbation.rp1_en5_digits", "residual_perturbation.rp2_en1_digits"])
def test_shipped_zoo_entries_load_noisy_and_accurate(name):
    from lightning_dprobust import zoo
    from lightning_dprobust.audit.membership import model_outputs
    from lightning_dprobust.data import DigitsDataModule

    entry = zoo.info(name)
    model = zoo.load(name)
    assert len(model.net.members) == entry.model["kwargs"]["ensemble_size"]
    assert entry.meta["privacy"] is None and "nominal" in entry.meta["notes"]
    datamodule = DigitsDataModule(seed=0)
    datamodule.setup("test")
    logits, labels = model_outputs(model, datamodule.test_set)
    again, _ = model_outputs(model, datamodule.test_set)
    assert not torch.equal(logits, again)
    assert (logits.argmax(1) == labels).float().mean() > entry.meta["metrics"]["test_acc"] - 0.05
