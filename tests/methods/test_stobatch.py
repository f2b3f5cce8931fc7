"""StoBatch: fit, privacy events, noise drawn once, fixed batches, resume, gradient isolation, DP adversarial
examples, the PixelDP interface, the CLI, bad inputs (spec section 17.1)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

from lightning_dprobust.callbacks.run import LedgerLogger, fit_summary
from lightning_dprobust.cli import main as dprobust
from lightning_dprobust.cli.loading import load_classifier
from lightning_dprobust.core import stobatch as sb
from lightning_dprobust.methods import StoBatch
from lightning_dprobust.methods import stobatch as method
from lightning_dprobust.robustness import stobatch_attacks
from tests.helpers import digits, quiet_trainer

ROOT = Path(__file__).resolve().parents[2]
BUFFERS = ("input_noise", "hidden_noise", "label_noise")


def module(**kwargs) -> StoBatch:
    defaults = dict(batch_size=120, attack_steps=2, lr=3e-3, num_classes=10, input_shape=(1, 8, 8))
    return StoBatch(**(defaults | kwargs))


def noise_of(sto: StoBatch) -> dict[str, torch.Tensor]:
    return {name: getattr(sto.net, name).clone() for name in BUFFERS}


class StepRecorder(L.Callback):
    """Keeps each step's batch and the noise buffers seen at each step."""

    def __init__(self):
        self.batches, self.noise = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append(batch[0].clone())
        self.noise.append(noise_of(pl_module))


def test_fit_learns_records_four_laplace_releases_and_logs_epsilon(tmp_path, caplog):
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="reproducibility mode"):  # a fixed draw: a secret one varies too much
        sto = module(epsilon=2.0, noise_seed=0)
    trainer = quiet_trainer(tmp_path, max_epochs=8, limit_val_batches=None, callbacks=[LedgerLogger()])
    with caplog.at_level("INFO"):
        trainer.fit(sto, digits())
    logged = trainer.callback_metrics["privacy/epsilon"].item()
    released = trainer.validate(sto, digits(), verbose=False)[0]["val/acc"]
    sto.net.inference_noise = "training_draw"
    paper = trainer.validate(sto, digits(), verbose=False)[0]["val/acc"]
    assert released > 0.3 and paper > 0.3  # chance is 0.1
    releases = {event.source: event.epsilon for event in sto.ledger.laplace}
    assert releases == {
        "stobatch.autoencoder": pytest.approx(sto.epsilon1),
        "stobatch.inputs": pytest.approx(sto.epsilon1 / sto.gamma_x),
        "stobatch.hidden": pytest.approx(sto.epsilon1 / sto.gamma),
        "stobatch.labels": pytest.approx(0.1),
    }
    assert sto.ledger.epsilon(0.0) == pytest.approx(2.0, rel=1e-12)
    assert logged == pytest.approx(2.0, rel=1e-6)
    assert "pure DP (delta 0: 4 Laplace releases)" in fit_summary(trainer, None)
    assert "StoBatch: epsilon = 2" in caplog.text


def test_noise_drawn_once_and_batches_fixed_disjoint_and_identical_every_epoch(tmp_path):
    sto, recorder = module(), StepRecorder()
    quiet_trainer(tmp_path, max_epochs=2, callbacks=[recorder]).fit(sto, digits())
    steps = len(recorder.batches) // 2
    assert steps == len(sto.batches) == 1293 // 120
    for first, second in zip(recorder.batches[:steps], recorder.batches[steps:], strict=True):
        assert torch.equal(first, second)  # same batches, same order, in both epochs
    for noise in recorder.noise:
        assert all(torch.equal(noise[name], getattr(sto.net, name)) for name in BUFFERS)
    flat = sto.batches.flatten().tolist()
    assert len(flat) == len(set(flat)) == steps * 120
    for benign, adversarial in sb.step_pairs(steps):
        assert not set(sto.batches[benign].tolist()) & set(sto.batches[adversarial].tolist())
    assert bool(sto.net.noise_drawn) and all(getattr(sto.net, name).abs().sum() > 0 for name in BUFFERS)


def test_noise_is_secret_by_default_and_redrawing_is_refused(tmp_path):
    draws = []
    for _ in range(2):
        L.seed_everything(0)
        sto = module()
        quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=1).fit(sto, digits())
        draws.append(sto.net.input_noise.clone())
    assert not torch.equal(draws[0], draws[1])  # seed_everything does not fix the secret draw
    with pytest.raises(RuntimeError, match="drawn once"):
        sto.draw_noise(torch.Generator())


def test_noise_scales_follow_the_budget():
    arch = dict(channels=64, kernel_size=4, hidden=256)
    sto = module(input_shape=(3, 28, 28), batch_size=100, model_kwargs=arch)
    assert sto.delta_r == 48 * (14 * 14 + 2) and sto.delta_l2 == 512
    assert sto.gamma_x == pytest.approx(sto.delta_r / 100) and sto.gamma == pytest.approx(2 * sto.delta_r / 100)
    assert sto.input_scale == pytest.approx(sto.delta_r / (100 * sto.epsilon1))
    assert sto.hidden_scale == pytest.approx(2 * sto.input_scale)
    assert sto.label_scale == pytest.approx(512 / sto.epsilon2)
    sto.draw_noise(torch.Generator().manual_seed(0))
    net = sto.net
    assert net.input_noise.abs().mean().item() == pytest.approx(sto.input_scale, rel=0.05)
    assert net.hidden_noise.abs().mean().item() == pytest.approx(sto.hidden_scale, rel=0.03)
    assert net.label_noise.abs().mean().item() == pytest.approx(sto.label_scale, rel=0.05)


def test_resume_restores_noise_and_batches_and_draws_nothing(tmp_path, monkeypatch):
    sto = module()
    trainer = quiet_trainer(tmp_path, max_epochs=1, enable_checkpointing=True)
    trainer.fit(sto, digits())
    ckpt = trainer.checkpoint_callback.best_model_path
    saved_noise, saved_batches, saved_epsilon = noise_of(sto), sto.batches.clone(), sto.ledger.epsilon(0.0)

    def refuse(*args, **kwargs):
        raise AssertionError("a resumed StoBatch run drew noise or batches again")

    monkeypatch.setattr(sb, "laplace", refuse)
    monkeypatch.setattr(sb, "fixed_disjoint_batches", refuse)
    resumed, recorder = module(), StepRecorder()
    quiet_trainer(tmp_path, max_epochs=3, callbacks=[recorder]).fit(resumed, digits(), ckpt_path=ckpt)
    assert len(recorder.batches) == 2 * len(saved_batches)
    assert all(torch.equal(saved_noise[name], noise[name]) for noise in recorder.noise for name in BUFFERS)
    assert torch.equal(resumed.batches, saved_batches)
    assert "batches" not in resumed.state_dict()  # the partition is secret: not in released weights
    assert resumed.ledger.epsilon(0.0) == saved_epsilon  # independent of the number of steps
    loaded = load_classifier(ckpt)
    assert all(torch.equal(saved_noise[name], getattr(loaded.net, name)) for name in BUFFERS)


def test_gradient_isolation_between_theta1_and_theta2():
    sto = module()
    sto.draw_noise(torch.Generator().manual_seed(0))
    data = digits()
    data.setup("fit")
    x, y = (t[:240] for t in data.train_set.tensors)
    reconstruction, classification = sto.stobatch_losses(x, y, 0.5, torch.Generator().manual_seed(0))
    theta1 = [sto.net.encoder.weight]
    theta2 = [p for name, p in sto.net.named_parameters() if not name.startswith("encoder")]
    assert all(g is None for g in torch.autograd.grad(reconstruction, theta2, retain_graph=True, allow_unused=True))
    assert all(g is None for g in torch.autograd.grad(classification, theta1, retain_graph=True, allow_unused=True))
    assert torch.autograd.grad(reconstruction, theta1, retain_graph=True)[0].abs().sum() > 0
    assert all(g.abs().sum() > 0 for g in torch.autograd.grad(classification, theta2[-2:]))


def test_training_attacks_stay_in_the_ball_and_never_read_the_labels(monkeypatch):
    sto = module()
    sto.draw_noise(torch.Generator().manual_seed(0))
    data = digits()
    data.setup("fit")
    x, y = (t[:240] for t in data.train_set.tensors)
    crafted = []
    real = stobatch_attacks.ensemble_attack

    def recording(model, x_bar, mu, steps, generator):
        crafted.append((x_bar, real(model, x_bar, mu, steps, generator)))
        return crafted[-1][1]

    monkeypatch.setattr(method, "ensemble_attack", recording)
    sto.stobatch_losses(x, y, 0.4, torch.Generator().manual_seed(1))
    sto.stobatch_losses(x, (y + 3) % 10, 0.4, torch.Generator().manual_seed(1))  # other labels, same examples
    (x_bar, first), (_, second) = crafted
    assert torch.equal(first, second)
    assert (first - x_bar).abs().max().item() <= 0.4 + 1e-6
    assert torch.equal(x_bar, sto.net.perturb(x[120:]))  # crafted from the perturbed source batch


def test_iterative_step_is_mu_over_steps():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    x_bar = torch.randn(5, 1, 2, 2)
    one_step = stobatch_attacks.iterative_attack(model, x_bar, 0.6, 4, "ifgsm")
    assert (one_step - x_bar).abs().max().item() <= 0.6 + 1e-6
    first = stobatch_attacks.iterative_attack(model, x_bar, 0.6 / 4, 1, "ifgsm")
    moved = (first - x_bar).abs()
    assert torch.allclose(moved[moved > 0], torch.tensor(0.15))


def test_pixeldp_interface(tmp_path):
    sto = module()
    quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=2).fit(sto, digits())
    sto.eval()
    before = noise_of(sto)
    x = torch.rand(3, 1, 8, 8)
    scores = sto.pixeldp_scores(x, 6, torch.Generator().manual_seed(0))
    assert scores.shape == (6, 3, 10) and (scores >= 0).all() and (scores <= 1).all()
    assert not torch.equal(scores[0], scores[1])  # fresh noise per draw
    assert torch.equal(scores, sto.pixeldp_scores(x, 6, torch.Generator().manual_seed(0)))
    assert all(torch.equal(before[name], getattr(sto.net, name)) for name in BUFFERS)
    assert sto.pixeldp_attack_norm == "linf"
    delta_rh = sto.net.neurons * sto.net.encoder.weight.abs().sum().item()
    expected = sto.delta_r / (120 * sto.epsilon1 * (64 + delta_rh / 2)) / 2
    assert sto.pixeldp_radius_scale() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="n=0"):
        sto.pixeldp_scores(x, 0, torch.Generator())


def test_cli_fit_of_the_digits_config(tmp_path, capsys):
    args = ["fit", "--config", str(ROOT / "configs/stobatch/digits.yaml"), "--trainer.max_epochs", "1"]
    args += ["--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path)]
    args += ["--trainer.enable_progress_bar", "false", "--trainer.limit_train_batches", "2"]
    args += ["--model.init_args.attack_steps", "1"]
    assert dprobust(args) == 0
    assert "fit done: epsilon 2, pure DP" in capsys.readouterr().out
    ckpt = next(tmp_path.rglob("last.ckpt"))
    assert torch.load(ckpt, weights_only=True)["privacy_ledger"]["laplace"][3] == ["stobatch.labels", 0.1]


def test_too_few_examples_for_two_batches_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="at least 2 disjoint batches") as error:
        quiet_trainer(tmp_path, max_epochs=1).fit(module(batch_size=700), digits())
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 2}, "batch_size"),
        ({"psi": 0.5}, "psi"),
        ({"mu_max": 0.0}, "mu_max"),
        ({"attack_steps": 0}, "attack_steps"),
        ({"theta1_bound": 0.0}, "theta1_bound"),
        ({"xi": -1.0}, "xi"),
        ({"reconstruction": "square"}, "reconstruction"),
        ({"epsilon": 0.05}, "too small"),
        ({"budget_split": "cifar10", "epsilon": 1.0}, "too small"),
        ({"budget_split": "svhn"}, "budget_split"),
    ],
)
def test_bad_arguments_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as error:
        module(**kwargs)
    assert "\n" not in str(error.value)


def test_ensemble_gives_each_attack_a_third_of_the_source_batch(monkeypatch):
    sizes = []

    def recording(model, x_bar, mu, steps, kind, generator=None):
        sizes.append((kind, len(x_bar)))
        return x_bar

    monkeypatch.setattr(stobatch_attacks, "iterative_attack", recording)
    stobatch_attacks.ensemble_attack(lambda z: z.flatten(1), torch.zeros(120, 1, 2, 2), 0.5, 3)
    assert sizes == [("ifgsm", 40), ("mim", 40), ("pgd", 40)]


def test_every_noise_enters_the_step():
    """chi1 shifts the inputs, 2 chi2 / m the first hidden layer, and chi3 adds -<chi3, W_pi> / m to the loss."""
    sto = module()
    sto.draw_noise(torch.Generator().manual_seed(0))
    net = sto.net
    x = torch.rand(240, 1, 8, 8)
    y = torch.randint(0, 10, (240,))
    assert torch.equal(net.perturb(x), 2 * x - 1 + net.input_noise)
    hidden = net.hidden(net.perturb(x)) - net.hidden_noise
    assert torch.allclose(hidden, torch.tanh(net.encoder(net.perturb(x))), atol=1e-5)
    _, noisy = sto.stobatch_losses(x, y, 0.3, torch.Generator().manual_seed(2))
    chi3 = net.label_noise.clone()
    net.label_noise.zero_()
    _, clean = sto.stobatch_losses(x, y, 0.3, torch.Generator().manual_seed(2))
    expected = -(chi3 * net.head.weight.t()).sum() / 120
    assert (noisy - clean).item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-4)
