"""AIN's bound decay (Eqs 5.7-5.9) and Algorithm 2's adaptive controller (thesis section 5.2.3)."""

from __future__ import annotations

import math

import pytest

from lightning_dprobust.core.ain_schedule import BoundController, decay_once, decayed_bound


@pytest.mark.parametrize(
    ("kind", "rate", "step_size", "closed"),
    [
        ("step", 0.7, 3, lambda b0, d, i: b0 * d ** (i // 3)),
        ("exp", -0.02, 1, lambda b0, d, i: b0 * math.exp(d * i)),
        ("time", 0.1, 1, lambda b0, d, i: b0 / (1 + d * i)),
    ],
)
def test_closed_and_iterative_forms_agree_with_the_thesis_formulas(kind, rate, step_size, closed):
    bound = 0.8
    for epoch in range(1, 40):
        bound = decay_once(kind, bound, rate, epoch, step_size)
        assert bound == pytest.approx(closed(0.8, rate, epoch), rel=1e-12)
        assert decayed_bound(kind, 0.8, rate, epoch, step_size) == pytest.approx(bound, rel=1e-12)
    assert bound < 0.8


@pytest.mark.parametrize(
    ("kind", "rate", "message"),
    [("exp", 0.02, "d < 0"), ("time", -0.1, "d > 0"), ("step", 1.5, "0 < d < 1"), ("linear", 0.1, "unknown")],
)
def test_a_decay_that_would_not_shrink_the_bound_is_refused(kind, rate, message):
    with pytest.raises(ValueError, match=message):
        decayed_bound(kind, 0.8, rate, 1)


def _controller(**kwargs) -> BoundController:
    defaults = dict(bound=0.8, rate=-0.02, kind="exp", t_up=1e-4, t_low=1e-5, gamma1=0.5, gamma2=0.5)
    return BoundController(**(defaults | kwargs))


def test_the_first_comparison_is_against_a_success_rate_of_one():
    controller = _controller()
    assert controller.previous_success == 1.0
    assert controller.update(0.9).action == "rollback"  # r = (1 - 0.9) / 0.9 > T_up


def test_a_scripted_sequence_of_validation_success_rates():
    controller = _controller()
    # S1 = S0 = 1: r = 0 < T_low, so the decay speeds up (|d| times 1.5), then B decays and S0 = S1
    decision = controller.update(1.0)
    assert (decision.action, controller.rate) == ("speedup", pytest.approx(-0.03))
    assert controller.bound == pytest.approx(0.8 * math.exp(-0.03)) and controller.previous_success == 1.0
    bound = controller.bound
    # a drop: r = (1 - 0.95) / 0.95 > T_up: roll back, the bound stays, the decay slows down (|d| times 0.5)
    decision = controller.update(0.95)
    assert (decision.action, controller.bound, controller.rate) == ("rollback", bound, pytest.approx(-0.015))
    assert controller.previous_success == 1.0 and controller.epoch == 1
    # r between T_low and T_up: plain decay with the unchanged rate, S0 <- S1
    s1 = 1.0 / (1 + 5e-5)
    decision = controller.update(s1)
    assert (decision.action, controller.rate) == ("decay", pytest.approx(-0.015))
    assert controller.bound == pytest.approx(bound * math.exp(-0.015)) and controller.previous_success == s1
    # a rise is a negative change, below T_low: speed up
    assert controller.update(1.0).action == "speedup" and controller.rate == pytest.approx(-0.0225)


def test_step_decay_slows_down_by_raising_d_towards_one_and_time_decay_by_shrinking_d():
    step = _controller(kind="step", rate=0.64)
    step.update(0.5)
    assert step.rate == pytest.approx(0.8)  # 0.64 ** 0.5: a slower decay
    time = _controller(kind="time", rate=0.2)
    time.update(0.5)
    assert time.rate == pytest.approx(0.1)


def test_without_adaptation_the_bound_follows_the_closed_form_and_stops_at_min_bound():
    controller = _controller(adaptive=False, rate=-0.5, min_bound=0.2)
    for epoch in range(1, 4):
        controller.update(0.1)  # a collapse that would roll back an adaptive controller
        assert controller.bound == pytest.approx(max(0.2, 0.8 * math.exp(-0.5 * epoch)))
    assert controller.bound == 0.2


def test_a_zero_success_rate_rolls_back_and_the_state_round_trips():
    controller = _controller()
    assert controller.update(0.0).action == "rollback"
    clone = _controller()
    clone.load_state_dict(controller.state_dict())
    assert clone == controller


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(t_up=1e-5, t_low=1e-4), "t_low < t_up"),
        (dict(gamma1=1.0), "gamma1"),
        (dict(bound=0.0), "bound > 0"),
        (dict(min_bound=0.9), "min_bound"),
    ],
)
def test_bad_controller_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _controller(**kwargs)


def test_a_success_rate_outside_zero_one_is_refused():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        _controller().update(1.5)
