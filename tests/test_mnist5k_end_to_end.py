"""End to end on the embedded real MNIST sample: the mnist5k DP-SGD recipe trains, accounts and certifies."""

from __future__ import annotations

import pytest
from opacus.accountants.analysis import rdp as opacus_rdp

from lightning_dprobust.core.accounting import DEFAULT_RDP_ORDERS
from lightning_dprobust.recipes import CONFIG_DIR, fit_recipe
from lightning_dprobust.robustness.certify import certify_dataset, summarize


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    overrides = [
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.max_epochs=1",
        f"--trainer.default_root_dir={tmp_path_factory.mktemp('mnist5k')}",
    ]
    return fit_recipe(CONFIG_DIR / "dpsgd" / "mnist5k.yaml", overrides)


def test_one_private_epoch_on_real_digits_learns_and_stays_within_the_budget(fitted):
    dp, data = fitted.privacy, fitted.datamodule
    assert len(data.train_set) == 3600 and tuple(fitted.module.input_shape) == (1, 28, 28)
    assert dp.loaders.sample_rate == pytest.approx(256 / 3600)
    steps = dp.ledger.steps
    assert steps == pytest.approx(3600 / 256, abs=1)
    orders = list(DEFAULT_RDP_ORDERS)  # the spent epsilon, recomputed with Opacus' independent RDP analysis
    rdp = opacus_rdp.compute_rdp(q=256 / 3600, noise_multiplier=dp.noise_multiplier, steps=steps, orders=orders)
    epsilon, _ = opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=dp.delta)
    assert dp.epsilon() == pytest.approx(epsilon, rel=1e-4) and 2.9 <= epsilon <= 3.0
    assert fitted.test["test/acc"] > 0.3  # ten balanced classes: chance is 0.1


def test_the_trained_model_certifies_real_test_images(fitted):
    model = fitted.module.eval()
    rows = certify_dataset(
        model, fitted.datamodule.test_set, sigma=0.25, n0=20, n=100, alpha=0.01, batch_size=200, seed=0,
        skip=50, progress=False,
    )  # fmt: skip
    summary = summarize(rows, (0.0, 0.25))
    assert summary["num_examples"] == 20
    assert 0.0 < summary["certified_acc@0"] <= 1.0 and summary["certified_acc@0.25"] <= summary["certified_acc@0"]
    labels = fitted.datamodule.test_set.tensors[1][::50].tolist()
    assert [row["label"] for row in rows] == labels
    assert all(row["radius"] > 0 or row["prediction"] == -1 for row in rows)
