"""Tests of randomized smoothing (Cohen, Rosenfeld and Kolter 2019, https://arxiv.org/abs/1902.02918).

Reference values come from closed forms (the Clopper-Pearson bound of ``count == n`` is ``alpha ** (1 / n)``; the
bound ``p`` solves ``P(Binomial(n, p) >= count) = alpha``), from published numbers, and from an independent port of
the published CERTIFY/PREDICT pseudocode written below.
"""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
import torch
from scipy.stats import beta, binom, binomtest, norm
from torch import nn

from lightning_dprobust.core import smoothing
from lightning_dprobust.core.smoothing import (
    ABSTAIN,
    Certificate,
    Smooth,
    certified_radius,
    lower_confidence_bound,
)

ALPHA = 0.001
INPUT = (3, 5, 5)


class ScheduledClassifier(nn.Module):
    """Ignores its input and votes the next labels of a fixed schedule, one per input row."""

    def __init__(self, labels: list[int], num_classes: int) -> None:
        super().__init__()
        self.labels = torch.tensor(labels)
        self.num_classes = num_classes
        self.position = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        labels = self.labels[self.position : self.position + len(x)]
        self.position += len(x)
        return nn.functional.one_hot(labels, self.num_classes).to(x.dtype)


def scheduled_smooth(*groups: tuple[int, int], num_classes: int = 3, sigma: float = 0.25) -> Smooth:
    """Smooth around a classifier voting ``count`` times ``label`` for each ``(label, count)`` in order."""
    labels = [label for label, count in groups for _ in range(count)]
    return Smooth(ScheduledClassifier(labels, num_classes), num_classes, sigma)


def small_cnn(num_classes: int = 5) -> nn.Module:
    """A random CNN on 3x5x5 inputs; 75 values per input is not a multiple of 16, so on CPU splitting or merging
    noise draws changes the values (peer_repos: the CPU normal fill works in blocks of 16)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.Tanh(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 2 * 2, num_classes),
    ).eval()


# --- Independent port of the published algorithm (pseudocode of Cohen et al., Algorithm "CERTIFY") ---------------


def reference_counts(model, x, num, batch_size, sigma, generator, num_classes):
    counts = np.zeros(num_classes, dtype=np.int64)
    with torch.no_grad():
        for _ in range(math.ceil(num / batch_size)):
            this_batch = min(batch_size, num)
            num -= this_batch
            batch = x.repeat((this_batch,) + (1,) * x.dim())
            noise = torch.randn(batch.shape, generator=generator, dtype=x.dtype) * sigma
            for label in model(batch + noise).argmax(1).cpu().numpy():
                counts[label] += 1
    return counts


def reference_certify(model, x, n0, n, alpha, batch_size, sigma, generator, num_classes):
    selection = reference_counts(model, x, n0, batch_size, sigma, generator, num_classes)
    top = int(selection.argmax())
    estimation = reference_counts(model, x, n, batch_size, sigma, generator, num_classes)
    n_a = int(estimation[top])
    p_lower = beta.ppf(alpha, n_a, n - n_a + 1) if n_a > 0 else 0.0
    if p_lower < 0.5:
        return ABSTAIN, 0.0, selection, estimation
    return top, sigma * norm.ppf(p_lower), selection, estimation


def reference_predict(model, x, n, alpha, batch_size, sigma, generator, num_classes):
    counts = reference_counts(model, x, n, batch_size, sigma, generator, num_classes)
    top2 = counts.argsort()[::-1][:2]
    if binomtest(int(counts[top2[0]]), int(counts[top2[0]] + counts[top2[1]]), p=0.5).pvalue > alpha:
        return ABSTAIN
    return int(top2[0])


# --- Statistics --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 100, 1000, 100000])
def test_lower_bound_all_votes_is_closed_form(n):
    # Beta(n, 1) has CDF p**n, so the bound for count == n is alpha ** (1 / n).
    assert lower_confidence_bound(n, n, ALPHA) == pytest.approx(ALPHA ** (1 / n), rel=1e-12)


@pytest.mark.parametrize(("count", "n"), [(1, 10), (66, 100), (550, 1000), (7321, 10000), (99000, 100000)])
def test_lower_bound_solves_the_one_sided_tail_equation(count, n):
    p = lower_confidence_bound(count, n, ALPHA)
    assert binom.sf(count - 1, n, p) == pytest.approx(ALPHA, rel=1e-6)


def test_lower_bound_of_zero_votes_is_zero():
    assert lower_confidence_bound(0, 100, ALPHA) == 0.0


def test_published_radii():
    # Cohen et al.'s setting: n = 100000, alpha = 0.001, sigma = 0.25, every vote for the top class.
    assert lower_confidence_bound(100000, 100000, ALPHA) == pytest.approx(0.9999309248330094, abs=1e-15)
    assert certified_radius(lower_confidence_bound(100000, 100000, ALPHA), 0.25) == pytest.approx(0.95286, abs=1e-5)
    assert certified_radius(lower_confidence_bound(1000, 1000, ALPHA), 0.25) == pytest.approx(0.6158, abs=1e-4)
    assert certified_radius(lower_confidence_bound(99000, 100000, ALPHA), 0.25) == pytest.approx(0.5725, abs=1e-4)


@pytest.mark.parametrize(("n", "expected_radius"), [(100000, 0.95286), (1000, 0.6158)])
def test_certify_with_a_constant_classifier_reaches_the_radius_ceiling(n, expected_radius):
    smooth = scheduled_smooth((1, 100 + n))
    cert = smooth.certify(torch.zeros(1, 2, 2), n0=100, n=n, alpha=ALPHA, batch_size=4096)
    assert isinstance(cert, Certificate)
    assert (cert.prediction, cert.count) == (1, n)
    assert cert.radius == pytest.approx(expected_radius, abs=1e-4)
    assert cert.p_lower == pytest.approx(ALPHA ** (1 / n), rel=1e-12)


def test_minimum_vote_count_to_certify():
    n = 100
    # lower bound >= 1/2  <=>  P(Binomial(n, 1/2) >= count) <= alpha: search the smallest such count.
    needed = next(k for k in range(n + 1) if binom.sf(k - 1, n, 0.5) <= ALPHA)
    assert needed == 66  # Cohen et al. (issue locuslab/smoothing#8): 66 of 100 votes are needed at alpha = 0.001
    below = scheduled_smooth((0, 10), (0, needed - 1), (2, n - needed + 1)).certify(
        torch.zeros(3), n0=10, n=n, alpha=ALPHA, batch_size=7
    )
    assert (below.prediction, below.radius, below.count) == (ABSTAIN, 0.0, needed - 1)
    assert below.abstained and below.p_lower < 0.5
    at = scheduled_smooth((0, 10), (0, needed), (2, n - needed)).certify(
        torch.zeros(3), n0=10, n=n, alpha=ALPHA, batch_size=7
    )
    assert (at.prediction, at.count) == (0, needed) and not at.abstained
    assert at.radius == pytest.approx(0.25 * norm.ppf(beta.ppf(ALPHA, needed, n - needed + 1)), rel=1e-12)
    assert 0 < at.radius < 0.01


def test_certify_counts_the_class_chosen_by_selection():
    # Selection votes class 2, the estimation draws all vote class 1: nA = 0, so certify must abstain.
    cert = scheduled_smooth((2, 50), (1, 1000)).certify(torch.zeros(3), n0=50, n=1000, alpha=ALPHA, batch_size=64)
    assert (cert.prediction, cert.count, cert.p_lower) == (ABSTAIN, 0, 0.0)


def test_selection_ties_go_to_the_first_class():
    cert = scheduled_smooth((2, 5), (1, 5), (1, 200)).certify(torch.zeros(3), n0=10, n=200, alpha=ALPHA, batch_size=3)
    assert cert.prediction == 1 and cert.count == 200


@pytest.mark.parametrize(
    ("top", "second", "expected"),
    [(60, 40, ABSTAIN), (65, 35, ABSTAIN), (66, 34, ABSTAIN), (70, 30, 2), (90, 10, 2), (50, 50, ABSTAIN)],
)
def test_predict_follows_the_exact_two_sided_binomial_test(top, second, expected):
    # Two-sided exact test at p = 1/2 by its definition: twice the upper tail of the larger count. At 66/34 the
    # one-sided p-value (0.0009) passes but the two-sided one (0.0018) does not.
    p_value = min(1.0, 2 * binom.sf(top - 1, top + second, 0.5))
    assert (p_value <= ALPHA) == (expected != ABSTAIN)
    smooth = scheduled_smooth((0, second), (2, top), num_classes=4)
    assert smooth.predict(torch.zeros(5), n=top + second, alpha=ALPHA, batch_size=16) == expected


# --- Equivalence with the published algorithm ---------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [7, 64, 100, 1000])
def test_certify_matches_the_published_algorithm(batch_size):
    model, num_classes, sigma = small_cnn(), 5, 0.5
    smooth = Smooth(model, num_classes, sigma)
    for seed in range(3):
        x = torch.rand(*INPUT, generator=torch.Generator().manual_seed(100 + seed))
        expected = reference_certify(model, x, 30, 450, ALPHA, batch_size, sigma, _gen(seed), num_classes)
        generator = _gen(seed)
        selection = smooth.sample_counts(x, 30, batch_size, generator)
        estimation = smooth.sample_counts(x, 450, batch_size, generator)
        cert = smooth.certify(x, n0=30, n=450, alpha=ALPHA, batch_size=batch_size, generator=_gen(seed))
        np.testing.assert_array_equal(selection.numpy(), expected[2])
        np.testing.assert_array_equal(estimation.numpy(), expected[3])
        assert (estimation > 0).sum() >= 2, "the test needs inputs whose noisy copies fall in several classes"
        assert (cert.prediction, cert.radius) == expected[:2]
        assert cert.count == expected[3][int(expected[2].argmax())]


@pytest.mark.parametrize("batch_size", [9, 128])
def test_predict_matches_the_published_algorithm(batch_size):
    model, num_classes, sigma = small_cnn(), 5, 0.5
    smooth = Smooth(model, num_classes, sigma)
    for seed in range(4):
        x = torch.rand(*INPUT, generator=torch.Generator().manual_seed(200 + seed))
        expected = reference_predict(model, x, 300, 0.01, batch_size, sigma, _gen(seed), num_classes)
        assert smooth.predict(x, n=300, alpha=0.01, batch_size=batch_size, generator=_gen(seed)) == expected


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- Soundness against a classifier whose smoothed radius is known exactly ---------------------------------------


def test_linear_classifier_radius_is_sound_and_tight():
    # f(x) = 0 if w.x + b > 0 else 1. Under N(0, sigma^2 I) noise g = f and p_A = Phi(|w.x + b| / (sigma ||w||)),
    # so g's exact robust radius sigma * PhiInv(p_A) is the distance |w.x + b| / ||w|| to the hyperplane.
    gen = torch.Generator().manual_seed(0)
    w, b, sigma = torch.randn(8, generator=gen), 0.3, 0.5
    linear = nn.Linear(8, 2)
    with torch.no_grad():
        linear.weight.copy_(torch.stack([w, torch.zeros(8)]))
        linear.bias.copy_(torch.tensor([b, 0.0]))
    smooth = Smooth(linear, 2, sigma)
    direction = w / w.norm()
    for k, distance in enumerate([-1.0, -0.6, -0.25, 0.25, 0.4, 0.75, 1.0]):
        x = torch.randn(8, generator=gen)
        x = x - ((x @ w + b) / w.norm()) * direction + distance * direction  # signed distance `distance`
        exact = abs(distance)
        cert = smooth.certify(x, n0=100, n=20000, alpha=ALPHA, batch_size=2500, generator=_gen(k))
        assert cert.prediction == (0 if distance > 0 else 1)
        assert cert.radius <= exact
        assert cert.radius >= 0.9 * exact


# --- Device, dtype, generator, mode --------------------------------------------------------------------------------


class Recorder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[torch.device, torch.dtype, bool, tuple[int, ...]]] = []

    def forward(self, x):
        self.seen.append((x.device, x.dtype, self.training, tuple(x.shape)))
        return torch.stack([x.flatten(1).sum(1), -x.flatten(1).sum(1)], 1)


def test_noise_is_drawn_on_the_input_device_and_dtype_in_batches():
    recorder = Recorder().train()
    x = torch.rand(2, 3, dtype=torch.float64)
    Smooth(recorder, 2, 0.25).certify(x, n0=5, n=23, alpha=ALPHA, batch_size=10)
    assert [s[3][0] for s in recorder.seen] == [5, 10, 10, 3]
    assert all(s[:3] == (x.device, torch.float64, False) and s[3][1:] == (2, 3) for s in recorder.seen)
    assert recorder.training, "the base classifier's mode must be restored"


def test_noise_has_the_requested_scale_and_is_added_to_x():
    captured = []
    model = nn.Sequential(nn.Flatten(), nn.Linear(4096, 2))
    model.register_forward_pre_hook(lambda module, args: captured.append(args[0].clone()))
    x = torch.full((4096,), 0.3)
    Smooth(model, 2, 0.2).sample_counts(x, 8, 8, _gen(0))
    noise = captured[0] - x
    assert noise.mean().item() == pytest.approx(0.0, abs=0.01)
    assert noise.std().item() == pytest.approx(0.2, rel=0.02)


def test_generator_reproducibility():
    smooth = Smooth(small_cnn(), 5, 0.5)
    x = torch.rand(*INPUT, generator=_gen(7))
    first = smooth.certify(x, 50, 500, ALPHA, 64, _gen(1))
    assert smooth.certify(x, 50, 500, ALPHA, 64, _gen(1)) == first
    counts = [smooth.sample_counts(x, 500, 64, _gen(seed)) for seed in (1, 2)]
    assert not torch.equal(counts[0], counts[1])
    torch.manual_seed(3)
    default_first = smooth.sample_counts(x, 500, 64)
    torch.manual_seed(3)
    assert torch.equal(smooth.sample_counts(x, 500, 64), default_first)


# --- Errors and documentation -------------------------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0, -0.1, float("inf"), float("nan"), True])
def test_rejects_bad_sigma(sigma):
    with pytest.raises(ValueError, match="sigma"):
        Smooth(nn.Identity(), 2, sigma)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n0": 0}, "n0"),
        ({"n": 2.5}, "n must"),
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": 1.0}, "alpha"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_certify_rejects_bad_arguments(kwargs, match):
    args = {"n0": 10, "n": 100, "alpha": ALPHA, "batch_size": 10} | kwargs
    with pytest.raises(ValueError, match=match):
        Smooth(Recorder(), 2, 0.25).certify(torch.rand(3), **args)


def test_rejects_batched_input_and_wrong_num_classes():
    with pytest.raises(ValueError, match="without batch dimension"):
        Smooth(nn.Linear(4, 2), 2, 0.25).sample_counts(torch.rand(1, 4), 10, 10)
    with pytest.raises(ValueError, match="num_classes"):
        Smooth(small_cnn(5), 4, 0.25).sample_counts(torch.rand(*INPUT), 10, 10)
    with pytest.raises(ValueError, match="num_classes"):
        Smooth(nn.Identity(), 1, 0.25)
    with pytest.raises(TypeError, match="floating-point"):
        Smooth(nn.Identity(), 2, 0.25).sample_counts(torch.ones(2, dtype=torch.long), 10, 10)


def test_statistics_reject_bad_arguments():
    with pytest.raises(ValueError, match="count"):
        lower_confidence_bound(11, 10, ALPHA)
    with pytest.raises(ValueError, match="abstains"):
        certified_radius(0.49, 0.25)
    assert certified_radius(0.5, 0.25) == 0.0


def test_docstring_examples():
    assert doctest.testmod(smoothing, raise_on_error=False).failed == 0
