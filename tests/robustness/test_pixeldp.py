"""``certify_pixeldp`` on toy mechanisms whose expected scores are known in closed form."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import beta

from lightning_dprobust.robustness.pixeldp import PixelDPMechanism, certify_pixeldp, pixeldp_metrics
from tests.robustness.pixeldp_toys import CategoricalMechanism, ConstantMechanism, ThresholdMechanism

GRID = torch.linspace(0.0, 1.0, 21).reshape(-1, 1)
LABELS = (GRID.reshape(-1) >= 0.5).long()


def certify(mechanism, x=GRID, y=LABELS, **kwargs):
    return certify_pixeldp(mechanism, x, y, **({"n": 2000, "seed": 3} | kwargs))


@pytest.mark.parametrize("bound", ["clopper_pearson", "hoeffding"])
@pytest.mark.parametrize("condition", ["paper", "strict"])
def test_the_certified_radius_never_crosses_the_true_decision_boundary(bound, condition):
    """PixelDP's guarantee, checked against the exact expected scores: ``argmax E f`` at ``x +- radius`` is the
    certified class. The check is sharp enough to catch a radius twice too large (for example a lost factor 1/2)."""
    toy = ThresholdMechanism(scales=(0.1,), t=0.5)
    cert = certify(toy, n=20000, bound=bound, condition=condition)
    certified = cert.radius > 0  # a zero radius claims nothing
    assert certified.sum() >= len(GRID) // 2
    x, radius, prediction = GRID.reshape(-1)[certified], cert.radius[certified], cert.prediction[certified]
    for sign in (-1, 1):
        assert (toy.expected(x + sign * radius).argmax(1) == prediction).all()
    doubled = [toy.expected(x + sign * 2 * radius).argmax(1) for sign in (-1, 1)]
    assert any((moved != prediction).any() for moved in doubled)


@pytest.mark.parametrize("bound", ["clopper_pearson", "hoeffding"])
def test_two_composed_laplace_mechanisms_certify_the_harmonic_radius(bound):
    """Lemma 5 / Corollary 1 on a toy: input noise of scale 0.1 and a second mechanism of scale 0.2 (the latent one
    of StoBatch has twice the input's scale) compose to ``1/0.1 + 1/0.2`` per unit radius. The certified radius stays
    inside the exact decision region of what each estimator bounds (expected scores for Hoeffding, argmax votes for
    Clopper-Pearson), and twice the radius would not."""
    toy = ThresholdMechanism(scales=(0.1, 0.2), t=0.5)
    expected = toy.expected if bound == "hoeffding" else toy.expected_votes  # what each estimator bounds
    cert = certify(toy, n=20000, bound=bound)
    certified = cert.radius > 0
    assert certified.sum() >= len(GRID) // 2
    x, radius, prediction = GRID.reshape(-1)[certified], cert.radius[certified], cert.prediction[certified]
    for sign in (-1, 1):
        assert (expected(x + sign * radius).argmax(1) == prediction).all()
    assert any((expected(x + sign * 2 * radius).argmax(1) != prediction).any() for sign in (-1, 1))


def test_clopper_pearson_certificates_are_the_closed_form_of_the_same_draws():
    """Replaying the seeded draws: counts, the bounds at eta / K (scipy's beta quantiles) and the radius."""
    toy, n, eta, seed = CategoricalMechanism([0.6, 0.3, 0.1], scale=0.4), 500, 0.05, 11
    x, y = torch.rand(4, 3), torch.zeros(4, dtype=torch.long)
    cert = certify(toy, x=x, y=y, n=n, eta=eta, seed=seed, batch_size=n * len(x))
    scores = toy.pixeldp_scores(x, n, torch.Generator().manual_seed(seed))
    counts = torch.nn.functional.one_hot(scores.argmax(-1), 3).sum(0)
    for row, count in enumerate(counts.tolist()):
        top, second = sorted(count, reverse=True)[:2]
        lower = beta.ppf(eta / 3, top, n - top + 1)
        upper = beta.ppf(1 - eta / 3, second + 1, n - second)
        expected = 0.4 * max(0.0, 0.5 * math.log(lower / upper))
        assert cert.prediction[row].item() == count.index(top)
        assert cert.radius[row].item() == pytest.approx(expected, rel=1e-9)


def test_hoeffding_radius_is_the_closed_form_and_grows_with_n_to_the_true_radius():
    scores, scale, eta = [0.7, 0.2, 0.1], 0.5, 0.05
    true_radius = scale * 0.5 * math.log(0.7 / 0.2)
    x, y = torch.rand(2, 3), torch.zeros(2, dtype=torch.long)
    radii = []
    for n in (100, 1000, 100000):
        cert = certify(ConstantMechanism(scores, scale), x=x, y=y, n=n, eta=eta, bound="hoeffding")
        width = math.sqrt(math.log(3 / eta) / (2 * n))
        assert cert.radius[0].item() == pytest.approx(scale * 0.5 * math.log((0.7 - width) / (0.2 + width)), rel=1e-9)
        radii.append(cert.radius[0].item())
    assert radii[0] < radii[1] < radii[2] < true_radius
    assert radii[2] > 0.95 * true_radius


def test_strict_is_never_more_lenient_than_paper_and_divides_by_psi():
    toy = CategoricalMechanism([0.8, 0.15, 0.05])
    paper = certify(toy, condition="paper")
    strict = certify(toy, condition="strict", psi=2.0)
    strict_unshrunk = certify(toy, condition="strict")
    assert (strict_unshrunk.radius <= paper.radius).all() and (strict_unshrunk.radius < paper.radius).any()
    assert torch.allclose(strict.radius, strict_unshrunk.radius / 2.0)


def test_robust_means_radius_at_least_mu_a():
    cert = certify(ThresholdMechanism(), mu_a=0.05)
    assert torch.equal(cert.robust, cert.radius >= 0.05)
    assert cert.robust.any() and not cert.robust.all()


def test_a_seeded_generator_makes_certificates_reproducible_without_touching_the_global_rng():
    state = torch.get_rng_state()
    first = certify(ThresholdMechanism(), seed=5)
    torch.manual_seed(123)  # the global RNG must not matter
    second = certify(ThresholdMechanism(), generator=torch.Generator().manual_seed(5))
    torch.set_rng_state(state)
    third = certify(ThresholdMechanism(), seed=5)
    assert torch.equal(torch.get_rng_state(), state)
    for field in ("prediction", "epsilon_r", "radius"):
        assert torch.equal(getattr(first, field), getattr(second, field))
        assert torch.equal(getattr(first, field), getattr(third, field))
    assert not torch.equal(first.epsilon_r, certify(ThresholdMechanism(), seed=6).epsilon_r)


def test_draws_are_chunked_to_the_batch_size_and_sum_to_n_per_example():
    toy = CategoricalMechanism([0.5, 0.5])
    certify(toy, x=torch.rand(10, 2), y=torch.zeros(10, dtype=torch.long), n=25, batch_size=40)
    assert all(draws * examples <= 40 for draws, examples in toy.calls)
    assert sum(draws for draws, _ in toy.calls) == 25 and {examples for _, examples in toy.calls} == {10}
    toy.calls.clear()
    certify(toy, x=torch.rand(10, 2), y=torch.zeros(10, dtype=torch.long), n=3, batch_size=4)
    assert sum(draws * examples for draws, examples in toy.calls) == 3 * 10
    assert max(examples for _, examples in toy.calls) == 4


def test_the_mechanism_runs_in_eval_mode_and_gets_its_mode_back():
    toy = ThresholdMechanism().train()
    certify(toy)
    assert toy.modes_seen and not any(toy.modes_seen) and toy.training


def test_certified_accuracy_is_at_most_conventional_and_non_increasing_in_mu_a():
    cert = certify(ThresholdMechanism())
    metrics = pixeldp_metrics(cert, LABELS, mu_a=(0.0, 0.05, 0.1, 0.2))
    certified = [metrics[f"certified_acc@{mu:g}"] for mu in (0.0, 0.05, 0.1, 0.2)]
    assert metrics["conventional_acc"] == pytest.approx(cert.correct.float().mean().item())
    assert all(c <= metrics["conventional_acc"] for c in certified)
    assert certified == sorted(certified, reverse=True) and certified[0] > certified[-1]
    assert certified[1] == pytest.approx((cert.correct & (cert.radius >= 0.05)).float().mean().item())


class Returning(CategoricalMechanism):
    def __init__(self, make):
        super().__init__([0.5, 0.5])
        self.make = make

    def pixeldp_scores(self, x, n, generator):
        return self.make(n, len(x))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n": 0}, "n must be an integer >= 1"),
        ({"eta": 0.0}, r"eta must lie in \(0, 1\)"),
        ({"eta": 1.5}, r"eta must lie in \(0, 1\)"),
        ({"bound": "bernstein"}, "bound must be one of"),
        ({"condition": "lenient"}, "condition must be one of"),
        ({"mu_a": -0.1}, "mu_a must be"),
        ({"batch_size": 0}, "batch_size must be"),
        ({"x": GRID * 2}, r"x must lie in \[0, 1\]"),
        ({"y": LABELS[:3]}, "y must be integer labels"),
        ({"mechanism": Returning(lambda n, b: torch.rand(n, b))}, r"must return \[n=.*, K\] scores"),
        ({"mechanism": Returning(lambda n, b: torch.rand(n + 1, b, 2))}, r"must return \[n=.*, K\] scores"),
        ({"mechanism": Returning(lambda n, b: torch.rand(n, b, 2) + 1)}, r"scores in \[0, 1\]"),
        ({"mechanism": Returning(lambda n, b: torch.full((n, b, 2), math.nan))}, r"scores in \[0, 1\]"),
        ({"mechanism": Returning(lambda n, b: torch.ones(n, b, 1))}, "K >= 2"),
        ({"psi": 0.5, "condition": "strict"}, "psi must be a finite number >= 1"),
        ({"mechanism": CategoricalMechanism([0.5, 0.5], scale=0.0)}, r"pixeldp_radius_scale\(\) must return"),
        ({"mechanism": CategoricalMechanism([0.5, 0.5], scale=math.inf)}, r"pixeldp_radius_scale\(\) must return"),
    ],
)
def test_bad_inputs_are_refused_with_one_clear_line(kwargs, message):
    mechanism = kwargs.pop("mechanism", CategoricalMechanism([0.5, 0.5]))
    with pytest.raises(ValueError, match=message):
        certify(mechanism, **kwargs)


def test_a_model_without_the_protocol_is_refused():
    assert isinstance(ThresholdMechanism(), PixelDPMechanism)
    with pytest.raises(TypeError, match="does not implement PixelDPMechanism"):
        certify(torch.nn.Linear(1, 2))
    toy = ThresholdMechanism()
    toy.pixeldp_attack_norm = "l2"
    with pytest.raises(ValueError, match="pixeldp_attack_norm must be 'linf'"):
        certify(toy)
