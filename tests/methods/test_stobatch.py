"""StoBatch: fit, the nominal epsilon, noise drawn once (the input noise once per fixed batch), fixed batches,
resume, gradient isolation, DP adversarial examples, the PixelDP interface, the CLI, bad inputs (spec section
17.1)."""

from __future__ import annotations

import math
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
BUFFERS = ("hidden_noise", "label_noise")
SECRETS = (*BUFFERS, "input_draws")


def module(**kwargs) -> StoBatch:
    defaults = dict(batch_size=120, attack_steps=2, lr=3e-3, num_classes=10, input_shape=(1, 8, 8))
    return StoBatch(**(defaults | kwargs))


def noise_of(sto: StoBatch) -> dict[str, torch.Tensor]:
    """The network's hidden and label draw and the module's per-batch input draws."""
    return {name: getattr(sto.net, name).clone() for name in BUFFERS} | {"input_draws": sto.input_draws.clone()}


class StepRecorder(L.Callback):
    """Keeps each step's batch and the noise buffers seen at each step."""

    def __init__(self):
        self.batches, self.noise = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append(batch[0].clone())
        self.noise.append(noise_of(pl_module))


def test_fit_learns_and_records_logs_and_prints_the_epsilon_as_nominal(tmp_path, caplog):
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="reproducibility mode"):  # a fixed draw: a secret one varies too much
        sto = module(epsilon=8.0, seed=0)
    trainer = quiet_trainer(tmp_path, max_epochs=8, limit_val_batches=None, callbacks=[LedgerLogger()])
    with caplog.at_level("INFO"), pytest.warns(UserWarning, match="NOT a differential-privacy guarantee"):
        trainer.fit(sto, digits())
    assert trainer.callback_metrics["privacy/nominal_epsilon"].item() == 8.0
    assert "privacy/epsilon" not in trainer.callback_metrics  # the ledger logger logs guarantees only
    released = trainer.validate(sto, digits(), verbose=False)[0]["val/acc"]
    assert released > 0.3  # chance is 0.1
    [claim] = sto.ledger.nominal
    assert (claim.source, claim.epsilon, claim.delta) == (method.NOMINAL_SOURCE, 8.0, 0.0)
    assert claim.epsilon == pytest.approx(sb.total_epsilon(sto.epsilon1, sto.epsilon2, sto.gamma, sto.gamma_x))
    assert sto.ledger.laplace == () and math.isinf(sto.ledger.epsilon(0.0))  # no DP guarantee is composed
    summary = fit_summary(trainer, None)
    assert "no DP guarantee; nominal epsilon 8 at delta 0 (stobatch.theorem4)" in summary and "pure DP" not in summary
    assert "StoBatch: no DP guarantee; nominal epsilon 8" in caplog.text
    assert "NOT a differential-privacy guarantee" in caplog.text


def test_noise_drawn_once_and_batches_fixed_disjoint_and_identical_every_epoch(tmp_path):
    sto, recorder = module(), StepRecorder()
    quiet_trainer(tmp_path, max_epochs=2, callbacks=[recorder]).fit(sto, digits())
    steps = len(recorder.batches) // 2
    assert steps == len(sto.batches) == 1293 // 120
    for first, second in zip(recorder.batches[:steps], recorder.batches[steps:], strict=True):
        assert torch.equal(first, second)  # same batches, same order, in both epochs
    for noise in recorder.noise:
        assert all(torch.equal(noise[name], value) for name, value in noise_of(sto).items())
    flat = sto.batches.flatten().tolist()
    assert len(flat) == len(set(flat)) == steps * 120
    for benign, adversarial in sb.step_pairs(steps):
        assert not set(sto.batches[benign].tolist()) & set(sto.batches[adversarial].tolist())
    assert bool(sto.net.noise_drawn) and all(getattr(sto.net, name).abs().sum() > 0 for name in BUFFERS)
    assert sto.input_draws.shape == (steps, 1, 8, 8)  # one input draw per fixed batch


def test_each_fixed_batch_has_its_own_input_noise_so_perturbed_differences_hide_clean_ones(tmp_path, monkeypatch):
    """One input draw shared by all batches (Alg. 1 line 1 as printed) gives ``x_bar_i - x_bar_j = x_i - x_j`` for
    every pair of training examples; each batch's own draw keeps that within a batch only (Eq. 16)."""
    sto, seen = module(attack_steps=1), []
    real = sto.net.perturb

    def spy(x, *args, **kwargs):
        x_bar = real(x, *args, **kwargs)
        if sto.net.training:
            seen.append((x.detach().clone(), x_bar.detach().clone()))
        return x_bar

    monkeypatch.setattr(sto.net, "perturb", spy)
    quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=2).fit(sto, digits())
    for step, (x, x_bar) in enumerate(seen):
        clean = 2 * x  # the paper's [-1, 1] scale
        assert torch.allclose(x_bar[0] - x_bar[1], clean[0] - clean[1], atol=1e-5)  # same batch, same draw
        assert not torch.allclose(x_bar[0] - x_bar[120], clean[0] - clean[120], atol=1e-2)  # two batches
        benign, adversarial = sb.step_pairs(len(sto.batches))[step]
        offsets = x_bar - (2 * x - 1)
        assert torch.allclose(offsets[:120], sto.input_draws[benign].expand(120, -1, -1, -1), atol=1e-5)
        assert torch.allclose(offsets[120:], sto.input_draws[adversarial].expand(120, -1, -1, -1), atol=1e-5)
    assert len(seen) == 2 and not torch.equal(sto.input_draws[0], sto.input_draws[1])


def test_noise_is_secret_by_default_and_redrawing_is_refused(tmp_path):
    draws = []
    for _ in range(2):
        L.seed_everything(0)
        sto = module()
        quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=1).fit(sto, digits())
        draws.append(sto.input_draws.clone())
    assert not torch.equal(draws[0], draws[1])  # seed_everything does not fix the secret draw
    with pytest.raises(RuntimeError, match="drawn once"):
        sto.draw_noise(torch.Generator())
    with pytest.raises(RuntimeError, match="drawn once"):
        sto.draw_input_noise(len(sto.batches), torch.Generator())


def test_noise_scales_follow_the_budget():
    arch = dict(channels=64, kernel_size=4, hidden=256)
    sto = module(input_shape=(3, 28, 28), batch_size=100, model_kwargs=arch)
    assert sto.delta_r == 48 * (14 * 14 + 2) and sto.delta_l2 == 512
    assert sto.gamma_x == pytest.approx(sto.delta_r / 100) and sto.gamma == pytest.approx(2 * sto.delta_r / 100)
    assert sto.input_scale == pytest.approx(sto.delta_r / (100 * sto.epsilon1))
    assert sto.hidden_scale == pytest.approx(2 * sto.input_scale)
    assert sto.label_scale == pytest.approx(512 / sto.epsilon2)
    sto.draw_noise(torch.Generator().manual_seed(0))
    sto.draw_input_noise(4, torch.Generator().manual_seed(1))
    net = sto.net
    assert sto.input_draws.shape == (4, 3, 28, 28)
    assert sto.input_draws.abs().mean().item() == pytest.approx(sto.input_scale, rel=0.05)
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
    assert all(torch.equal(saved_noise[name], noise[name]) for noise in recorder.noise for name in SECRETS)
    assert torch.equal(resumed.batches, saved_batches)
    assert "batches" not in resumed.state_dict()  # the partition is secret: not in released weights
    assert resumed.ledger.nominal == sto.ledger.nominal and math.isinf(saved_epsilon)  # nominal, whatever the steps
    loaded = load_classifier(ckpt)
    assert all(torch.equal(saved_noise[name], getattr(loaded.net, name)) for name in BUFFERS)
    assert torch.equal(saved_noise["input_draws"], loaded.input_draws)


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
    sto.draw_input_noise(2, torch.Generator().manual_seed(2))
    offset = sto.input_offsets(torch.arange(2).repeat_interleave(120), x)
    crafted = []
    real = stobatch_attacks.ensemble_attack

    def recording(model, x_bar, mu, steps, generator):
        crafted.append((x_bar, real(model, x_bar, mu, steps, generator)))
        return crafted[-1][1]

    monkeypatch.setattr(method, "ensemble_attack", recording)
    sto.stobatch_losses(x, y, 0.4, torch.Generator().manual_seed(1), offset)
    sto.stobatch_losses(x, (y + 3) % 10, 0.4, torch.Generator().manual_seed(1), offset)  # other labels
    (x_bar, first), (_, second) = crafted
    assert torch.equal(first, second)
    assert (first - x_bar).abs().max().item() <= 0.4 + 1e-6
    assert torch.equal(x_bar, 2 * x[120:] - 1 + sto.input_draws[1])  # from the source batch, perturbed by its draw


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
    assert "fit done: no DP guarantee; nominal epsilon 2 at delta 0" in capsys.readouterr().out
    ledger = torch.load(next(tmp_path.rglob("last.ckpt")), weights_only=True)["privacy_ledger"]
    assert ledger["nominal"] == [["stobatch.theorem4", 2.0, 0.0]] and "laplace" not in ledger


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
    """chi1_b shifts the inputs of batch b, 2 chi2 / m the first hidden layer, and chi3 adds -<chi3, W_pi> / m to
    the loss."""
    sto = module()
    sto.draw_noise(torch.Generator().manual_seed(0))
    sto.draw_input_noise(3, torch.Generator().manual_seed(1))
    net = sto.net
    x = torch.rand(240, 1, 8, 8)
    y = torch.randint(0, 10, (240,))
    membership = torch.tensor([2, 0]).repeat_interleave(120)
    offset = sto.input_offsets(membership, x)
    assert torch.equal(net.perturb(x, offset), 2 * x - 1 + sto.input_draws[membership])
    with pytest.raises(RuntimeError, match="its own fixed batch"):
        sto.input_offsets(torch.full((240,), -1), x)  # an example in no fixed batch has no input draw
    hidden = net.hidden(net.perturb(x)) - net.hidden_noise
    assert torch.allclose(hidden, torch.tanh(net.encoder(net.perturb(x))), atol=1e-5)
    _, noisy = sto.stobatch_losses(x, y, 0.3, torch.Generator().manual_seed(2))
    chi3 = net.label_noise.clone()
    net.label_noise.zero_()
    _, clean = sto.stobatch_losses(x, y, 0.3, torch.Generator().manual_seed(2))
    expected = -(chi3 * net.head.weight.t()).sum() / 120
    assert (noisy - clean).item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-4)
