"""TransDenoiser (thesis chapter 6): input noise, frozen classifier, slicing, top-up noise and the privacy ledger."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dprobust.callbacks import DPCallback, TransDenoiserCallback
from lightning_dprobust.callbacks.transdenoiser import NOMINAL_SOURCE, VanishingNoiseError, release_slices_
from lightning_dprobust.core.accounting import epsilon_for
from lightning_dprobust.core.calibration import max_steps_within_budget
from lightning_dprobust.core.smoothing import Smooth
from lightning_dprobust.methods import TransDenoiser
from tests.helpers import digits, quiet_trainer, wandb_run_file
from tests.methods.transdenoiser_helpers import denoiser, ready_callback

pytestmark = [
    pytest.mark.filterwarnings("ignore:noise seed"),
    pytest.mark.filterwarnings("ignore:.*reproducibility mode"),
]


def checksum(module: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode() + tensor.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


class Recorder(Callback):
    """Keeps each step's ``sigma_bar`` of the TransDenoiser callback; stops training after ``stop_after`` steps."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.steps: list[dict[str, float]] = []
        self.stop_after = stop_after

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        dp = next(c for c in trainer.callbacks if isinstance(c, TransDenoiserCallback))
        self.steps.append(dict(dp.last_multipliers))
        if len(self.steps) == self.stop_after:
            trainer.should_stop = True


def fit(tmp_path, module, mode: str | None, recorder: Callback | None = None, **trainer_kwargs):
    callbacks = [] if mode is None else [TransDenoiserCallback(mode=mode, delta=1e-5, seed=4)]
    trainer = quiet_trainer(tmp_path, callbacks=callbacks + ([recorder] if recorder else []), **trainer_kwargs)
    trainer.fit(module, digits(batch_size=64))
    return trainer, (callbacks[0] if callbacks else None)


def test_input_noise_is_fresh_gaussian_and_the_loss_is_the_denoising_mse():
    module = denoiser(sigma=0.25)
    x = torch.rand(256, 1, 8, 8)
    _, z1 = module.training_inputs((x, torch.zeros(256, dtype=torch.long)))
    _, z2 = module.training_inputs((x, torch.zeros(256, dtype=torch.long)))
    assert not torch.equal(z1, z2)
    assert float((z1 - x).std()) == pytest.approx(0.25, rel=0.05)
    expected = (module.model(z1) - x).pow(2).flatten(1).sum(1)
    torch.testing.assert_close(module.per_example_loss(x, z1), expected)


def test_ramp_schedule_grows_to_sigma():
    module = denoiser(sigma=0.1, sigma_schedule="ramp", sigma_start=0.02, ramp_rate=0.5)
    assert module.current_sigma() == pytest.approx(0.02)
    assert denoiser(sigma=0.1).current_sigma() == pytest.approx(0.1)


def test_slices_are_disjoint_cover_the_denoiser_and_exclude_the_classifier():
    module = denoiser()
    slices = module.parameter_slices()
    names = [name for key in ("first", "middle", "last") for name in slices[key]]
    assert len(names) == len(set(names))
    assert set(names) == {name for name, _ in module.named_parameters() if name.startswith("model.")}
    optimizer = module.configure_optimizers()
    groups = [{id(p) for p in group["params"]} for group in optimizer.param_groups]
    assert [group["slice"] for group in optimizer.param_groups] == ["first", "middle", "last"]
    assert all(not (a & b) for i, a in enumerate(groups) for b in groups[i + 1 :])
    assert not any(p.requires_grad for p in module.classifier.parameters())


def test_forward_is_classifier_of_denoised_input():
    module = denoiser()
    x = torch.rand(3, 1, 8, 8)
    torch.testing.assert_close(module(x), module.classifier(module.model(x)))


@pytest.mark.parametrize("mode", [None, "sepdp", "transdenoiser"])
def test_frozen_classifier_checksum_unchanged_and_denoiser_trained(tmp_path, mode):
    module = denoiser()
    before_h, before_g = checksum(module.classifier), checksum(module.model)
    fit(tmp_path, module, mode, max_steps=2)
    assert checksum(module.classifier) == before_h
    assert checksum(module.model) != before_g
    assert not module.classifier.training


def test_ledger_records_xi_up_and_training_stops_at_the_budget(tmp_path):
    module = denoiser()
    trainer, dp = fit(tmp_path, module, "sepdp", max_epochs=1000)
    budget = max_steps_within_budget(1.0, 1e-5, 2.0, dp.loaders.sample_rate)
    assert dp.ledger.steps == budget == trainer.global_step
    assert [(e.noise_multiplier, e.steps) for e in dp.ledger.history] == [(2.0, budget)]
    assert dp.epsilon() <= 1.0
    dp.ledger.record(2.0, dp.loaders.sample_rate)
    assert dp.epsilon() > 1.0
    assert dp.planned_steps == budget


def test_sepdp_noise_is_at_least_transdenoisers_at_every_step(tmp_path):
    sep, trans = Recorder(), Recorder()
    fit(tmp_path / "sep", denoiser(), "sepdp", sep, max_steps=3)
    fit(tmp_path / "trans", denoiser(), "transdenoiser", trans, max_steps=3)
    assert len(sep.steps) == len(trans.steps) == 3
    for s, t in zip(sep.steps, trans.steps, strict=True):
        assert s == {"first": 2.0, "middle": 2.0, "last": 2.0}
        assert all(t[key] <= s[key] for key in s)
        assert t["middle"] == 2.0  # not in transform_slices: always the full noise
    assert any(t["last"] < 2.0 for t in trans.steps)  # the transformation did reduce the noise


def test_the_ledger_records_the_noise_added_and_the_thesis_claim_beside_it_as_nominal(tmp_path):
    """Each step is accounted at the smallest sigma_bar over the slices: the added noise's epsilon is the accountant's
    value on that sequence, above the thesis's epsilon at xi_up, which is kept as a nominal claim. Both are nominal:
    sigma_bar is chosen from the private batch, so the DP epsilon is infinite."""
    recorder = Recorder()
    _, dp = fit(tmp_path, denoiser(), "transdenoiser", recorder, max_steps=3)
    added = [min(step.values()) for step in recorder.steps]
    assert any(value < 2.0 for value in added)
    q = dp.loaders.sample_rate
    assert [(e.noise_multiplier, e.steps) for e in dp.ledger.history] == [(value, 1) for value in added]
    expected = epsilon_for([(v, q, 1) for v in added], 1e-5, dp.accountant)
    assert dp.added_noise_epsilon() == pytest.approx(expected, rel=1e-12)
    claim = dp.thesis_claim()
    assert (claim.source, claim.epsilon) == (NOMINAL_SOURCE, epsilon_for([(2.0, q, 3)], 1e-5, dp.accountant))
    assert claim.epsilon < dp.added_noise_epsilon() < math.inf and not dp.ledger.nominal
    assert dp.epsilon() == math.inf
    summary = dp.privacy_summary()
    assert summary.startswith("no DP guarantee (epsilon = inf") and "nominal epsilon" in summary


def test_sepdp_is_dp_sgd_and_its_epsilon_a_guarantee(tmp_path):
    _, dp = fit(tmp_path, denoiser(), "sepdp", max_steps=3)
    assert dp.epsilon() == dp.added_noise_epsilon() < math.inf
    assert dp.privacy_summary().endswith("is the guarantee")


def test_the_budget_holds_for_the_noise_added(tmp_path):
    """Run to the budget: the recorded epsilon stays within target_epsilon and a further full step would exceed it."""
    trainer, dp = fit(tmp_path, denoiser(), "transdenoiser", max_epochs=1000)
    assert dp.ledger.steps == trainer.global_step > 0
    assert any(e.noise_multiplier < 2.0 for e in dp.ledger.history)
    assert dp.added_noise_epsilon() <= 1.0
    dp.ledger.record(2.0, dp.loaders.sample_rate)
    assert dp.added_noise_epsilon() > 1.0


def _long_plan_callback(**kwargs) -> TransDenoiserCallback:
    """T in the hundred thousands (the MNIST recipe plans 25,290): sqrt(T S_min) sigma > xi_up, so sigma_bar = 0."""
    return TransDenoiserCallback(delta=1e-5, seed=4, target_epsilon=1e4, transform_slices=("last",), **kwargs)


def test_a_vanishing_sigma_bar_stops_the_run_before_anything_is_released(tmp_path):
    module = denoiser()
    before = checksum(module.denoiser)
    dp = _long_plan_callback()
    trainer = quiet_trainer(tmp_path, callbacks=[dp], max_steps=10**6)
    with pytest.raises(VanishingNoiseError, match=r"sigma_bar = 0 on slice 'last' at step 0 .*fewer steps.*xi_up"):
        trainer.fit(module, digits(batch_size=64))
    assert dp.ledger.steps == 0 and checksum(module.denoiser) == before


def test_thesis_accounting_records_the_nominal_claim_and_no_guarantee(tmp_path):
    recorder = Recorder(stop_after=2)
    dp = _long_plan_callback(thesis_accounting=True)
    with pytest.warns(UserWarning, match="NOT a differential-privacy guarantee"):
        quiet_trainer(tmp_path, callbacks=[dp, recorder], max_steps=10**6).fit(denoiser(), digits(batch_size=64))
    assert [step["last"] for step in recorder.steps] == [0.0, 0.0]  # the thesis's claim with no Gaussian noise
    assert dp.epsilon() == math.inf
    (claim,) = dp.ledger.nominal
    q = dp.loaders.sample_rate
    assert (claim.source, claim.epsilon) == (NOMINAL_SOURCE, epsilon_for([(2.0, q, 2)], 1e-5, dp.accountant))
    assert dp.privacy_summary().startswith("no DP guarantee; nominal epsilon")
    assert dp.ledger.nominal_summary() in dp.privacy_summary()


def test_negative_cases_get_xi_up(tmp_path):
    dp, module = ready_callback(tmp_path)
    x = torch.rand(8, 1, 8, 8)
    z = x + 0.25 * torch.randn_like(x)
    losses = module.per_example_loss(x, z).detach()
    norms = torch.ones(8)
    assert dp.slice_multipliers((x, z), losses, norms)["last"] < 2.0
    losses[5] = -1.0  # example 5 becomes a negative case (o < 0)
    assert dp.slice_multipliers((x, z), losses, norms) == {"first": 2.0, "middle": 2.0, "last": 2.0}


def test_rank_guard_falls_back_to_xi_up_with_a_warning(tmp_path):
    dp, module = ready_callback(tmp_path, transform_slices=("first", "last"))
    x = torch.rand(1, 1, 8, 8)  # one example: rank <= 64 < 160 parameters of the first slice
    z = x + 0.25 * torch.randn_like(x)
    with pytest.warns(UserWarning, match="S_min"):
        multipliers = dp.slice_multipliers((x, z), module.per_example_loss(x, z).detach(), torch.ones(1))
    assert multipliers["first"] == 2.0


def test_the_gradient_noise_comes_from_the_dp_randomness(tmp_path):
    """Same input noise and data order: the same ``seed`` gives the same denoiser, another seed another one."""
    trained = []
    for run, seed in enumerate((4, 4, 5)):
        module = denoiser()
        trainer = quiet_trainer(
            tmp_path / str(run), callbacks=[TransDenoiserCallback(delta=1e-5, seed=seed)], max_steps=2
        )
        trainer.fit(module, digits(batch_size=64))
        trained.append(checksum(module.denoiser))
    assert trained[0] == trained[1] != trained[2]


def test_each_slice_gets_noise_of_its_own_std():
    grads = {"a": torch.zeros(20000), "b": torch.zeros(100, 100)}
    noisy = release_slices_(
        grads, {"s1": ["a"], "s2": ["b"]}, {"s1": 2.0, "s2": 0.5}, 1.0, torch.Generator().manual_seed(0)
    )
    assert float(noisy["a"].std()) == pytest.approx(2.0, rel=0.03)
    assert float(noisy["b"].std()) == pytest.approx(0.5, rel=0.03)


def test_certify_smooths_classifier_of_denoiser():
    module = denoiser().eval()
    smooth = Smooth(module, num_classes=10, sigma=0.25)
    result = smooth.certify(torch.rand(1, 8, 8), n0=10, n=100, alpha=0.001, batch_size=50)
    assert result.prediction == -1 or 0 <= result.prediction < 10


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "fast"}, "mode"),
        ({"xi_up": 1.0, "xi_low": 2.0}, "xi_low"),
        ({"xi_up": -1.0}, "xi_up"),
        ({"transform_slices": ("first", "bottom")}, "unknown slices"),
        ({"engine": "ghost"}, "engine"),
        ({"clipping": "psac"}, "clipping"),
        ({"thesis_accounting": "yes"}, "thesis_accounting"),
    ],
)
def test_bad_callback_arguments_are_refused(tmp_path, kwargs, match):
    with pytest.raises(MisconfigurationException, match=match):
        dp = TransDenoiserCallback(delta=1e-5, **kwargs)
        quiet_trainer(tmp_path, callbacks=[dp], max_steps=1).fit(denoiser(), digits(batch_size=64))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"sigma": 0.0}, "sigma"), ({"classifier": "no_such.entry"}, "zoo entry"), ({"sigma_schedule": "cosine"}, "ramp")],
)
def test_bad_module_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        denoiser(**kwargs)


@pytest.mark.parametrize(
    ("classifier", "match"),
    [
        ("cnn_tanh.erm_mnist5k", r"classifier='cnn_tanh.erm_mnist5k'\) does not take inputs of shape \(1, 8, 8\)"),
        (torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3)), r"predicts 3 classes but the data has 10"),
    ],
    ids=["another-input-shape", "another-number-of-classes"],
)
def test_a_classifier_trained_for_another_dataset_is_refused(classifier, match):
    """It used to be accepted: a shape error deep in the first forward, or accuracies over the wrong classes."""
    with pytest.raises(ValueError, match=match) as error:
        denoiser(classifier=classifier)
    assert "\n" not in str(error.value) and "trained for" in str(error.value)


def test_callback_refuses_a_classifier_module(tmp_path):
    from lightning_dprobust.methods import DPSGD

    module = DPSGD(model="mlp_tanh", input_shape=(1, 8, 8))
    with pytest.raises(MisconfigurationException, match="TransDenoiser"):
        quiet_trainer(tmp_path, callbacks=[TransDenoiserCallback(delta=1e-5)], max_steps=1).fit(module, digits())


def test_resume_refuses_another_mode_or_accounting():
    dp = TransDenoiserCallback(mode="sepdp", delta=1e-5)
    state = dp.state_dict()
    with pytest.raises(MisconfigurationException, match="mode"):
        TransDenoiserCallback(mode="transdenoiser", delta=1e-5).load_state_dict(state)
    with pytest.raises(MisconfigurationException, match="thesis_accounting"):
        TransDenoiserCallback(mode="sepdp", delta=1e-5, thesis_accounting=True).load_state_dict(state)
    assert isinstance(dp, DPCallback) and math.isclose(dp.noise_multiplier, 2.0)


def test_certify_command_takes_a_denoiser_checkpoint_in_front_of_a_classifier(tmp_path, capsys):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lightning_dprobust.cli import main
    from lightning_dprobust.cli.loading import load_classifier

    module = denoiser(classifier="mlp_tanh.erm_digits")
    saver = ModelCheckpoint(dirpath=tmp_path, filename="td")
    quiet_trainer(tmp_path, max_steps=2, enable_checkpointing=True, callbacks=[saver]).fit(module, digits())
    restored = load_classifier(str(tmp_path / "td.ckpt"))
    assert isinstance(restored, TransDenoiser)
    small = ["--n0", "10", "--n", "50", "--max_examples", "4", "--no-progress", "--no-wandb", "--device", "cpu"]
    pair = ["--ckpt", "mlp_tanh.erm_digits", "--denoiser", str(tmp_path / "td.ckpt")]
    assert main(["certify", *pair, *small, "--out", str(tmp_path / "pair")]) == 0
    assert main(["certify", "--ckpt", str(tmp_path / "td.ckpt"), *small, "--out", str(tmp_path / "alone")]) == 0
    pair_rows = (tmp_path / "pair" / "mlp_tanh.erm_digits" / "certify.csv").read_text().splitlines()[1:]
    alone_rows = (tmp_path / "alone" / "td" / "certify.csv").read_text().splitlines()[1:]
    without_time = [[row.rsplit(",", 1)[0] for row in rows] for rows in (pair_rows, alone_rows)]
    assert without_time[0] == without_time[1]  # the same h(g(x)) with the same generator: the same certificates
    assert main(["certify", "--ckpt", "mlp_tanh.erm_digits", "--denoiser", "mlp_tanh.erm_digits", *small]) == 2
    assert "holds no denoiser" in capsys.readouterr().err


@pytest.mark.slow
def test_dprobust_fit_of_the_digits_config_logs_to_wandb_and_prints_epsilon(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.helpers import read_wandb_history

    config = Path(__file__).resolve().parents[2] / "configs" / "transdenoiser" / "digits.yaml"
    env = os.environ | {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env.pop("WANDB_SERVICE", None)
    command = [
        str(Path(sys.executable).with_name("dprobust")),
        "fit",
        "--config",
        str(config),
        "--trainer.max_epochs=1",
    ]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "DPCallback: final epsilon=" in result.stdout + result.stderr
    run_file = wandb_run_file(tmp_path / "runs/transdenoiser-digits")
    rows = read_wandb_history(run_file)
    epsilons = [row["privacy/epsilon"] for row in rows if "privacy/epsilon" in row]
    assert len(epsilons) == 1 and 0 < epsilons[0] <= 1.0
    assert [row["val/acc"] for row in rows if "val/acc" in row] and any("val/mse" in row for row in rows)
    assert list(tmp_path.glob("runs/transdenoiser-digits/**/last.ckpt"))
