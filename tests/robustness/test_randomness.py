"""Attacks on their own streams: no attack reads, advances or reseeds the global RNGs; each run is reproducible."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torchattacks

from lightning_dprobust.robustness.attacks import build_attack, robust_accuracy
from lightning_dprobust.robustness.randomness import AttackRandomness, attack_seed, isolated_rng

EPS = 0.1


@pytest.fixture(scope="module")
def trained(digits_classifier):
    model, x, y = digits_classifier
    return model, x[:16], y[:16]


def global_states() -> tuple:
    return torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()


def assert_same_states(before: tuple, after: tuple) -> None:
    assert torch.equal(before[0], after[0])
    assert np.array_equal(before[1], after[1])
    assert before[2] == after[2]


def test_apgd_reseeds_the_global_rng_but_not_through_an_attack_stream(trained):
    model, x, y = trained
    apgd = torchattacks.APGD(model, eps=EPS, steps=2, seed=0)
    after = []
    for seed in (1, 2):  # two different global states before the attack, the same after: APGD reseeds
        torch.manual_seed(seed)
        apgd(x, y)
        after.append(torch.get_rng_state())
    assert torch.equal(after[0], after[1])
    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    before = global_states()
    AttackRandomness(0).run(apgd, x, y)
    assert_same_states(before, global_states())


def test_isolated_rng_restores_torch_numpy_and_python_states():
    before = global_states()
    with isolated_rng():
        torch.manual_seed(0)
        torch.rand(5)
        np.random.seed(0)
        np.random.rand(5)
        random.seed(0)
    assert_same_states(before, global_states())


def test_each_run_draws_from_the_stream_alone_and_resumes_from_its_state(trained):
    model, x, y = trained
    pgd = torchattacks.PGD(model, eps=EPS, steps=1)  # the random start decides the output
    stream = AttackRandomness(5)
    first, second = stream.run(pgd, x, y), stream.run(pgd, x, y)
    assert not torch.equal(first, second)
    replay = AttackRandomness(5)
    torch.manual_seed(123)  # whatever the global RNG holds
    assert torch.equal(replay.run(pgd, x, y), first)
    saved = replay.state_dict()
    resumed = AttackRandomness(99)
    resumed.load_state_dict(saved)
    assert torch.equal(resumed.run(pgd, x, y), second)


def test_attack_seeds_depend_on_the_seed_and_the_name():
    seeds = {attack_seed(seed, name) for seed in (0, 1) for name in ("PGD", "PGDL2", "CW")}
    assert len(seeds) == 6 and all(0 <= seed < 2**63 for seed in seeds)
    assert attack_seed(0, "PGD") == attack_seed(0, "PGD")


def test_robust_accuracy_gives_an_attack_the_same_result_whatever_else_runs(trained, monkeypatch):
    model, x, y = trained
    outputs = []
    forward = torchattacks.PGD.forward

    def recording(self, images, labels):
        outputs.append(forward(self, images, labels))
        return outputs[-1]

    monkeypatch.setattr(torchattacks.PGD, "forward", recording)
    pgd = build_attack("PGD", model, EPS, steps=1)
    alone = robust_accuracy(model, (x, y), {"PGD": pgd}, seed=4)
    before = global_states()
    others = {"PGDL2": build_attack("PGDL2", model, 0.5, steps=1), "APGD": torchattacks.APGD(model, eps=EPS, steps=1)}
    together = robust_accuracy(model, (x, y), {**others, "PGD": pgd}, seed=4)
    assert_same_states(before, global_states())
    assert torch.equal(outputs[0], outputs[1]) and alone["PGD"] == together["PGD"]
    robust_accuracy(model, (x, y), {"PGD": pgd}, seed=5)
    assert not torch.equal(outputs[0], outputs[2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_an_attack_on_cuda_leaves_the_cuda_rng_as_it_found_it(trained):
    model, x, y = trained
    model, x, y = model.cuda(), x.cuda(), y.cuda()
    apgd = torchattacks.APGD(model, eps=EPS, steps=2)  # calls torch.cuda.random.manual_seed
    torch.cuda.manual_seed(11)
    before = torch.cuda.get_rng_state()
    AttackRandomness(0).run(apgd, x, y)
    assert torch.equal(before, torch.cuda.get_rng_state())
    model.cpu()
