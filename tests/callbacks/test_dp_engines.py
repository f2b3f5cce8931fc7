"""DPCallback's engine choice: logged, and both engines train to the same parameters under the same randomness."""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import BaseFinetuning
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.core.ghost import GhostClipper
from lightning_dprobust.core.per_sample import PerExampleClipper
from lightning_dprobust.methods import DPSGD, DPCert
from tests.helpers import digits, quiet_trainer


def train(
    tmp_path, engine: str, method: type = DPSGD, model: str | torch.nn.Module = "cnn_tanh", **kwargs
) -> tuple[DPCallback, torch.Tensor]:
    L.seed_everything(0, verbose=False)
    module = method(model=model, num_classes=10, input_shape=(1, 8, 8), lr=0.5, **kwargs)
    callback = DPCallback(max_grad_norm=0.5, noise_multiplier=1.0, delta=1e-5, engine=engine, seed=0)
    quiet_trainer(tmp_path, max_steps=3, callbacks=[callback]).fit(module, digits(batch_size=64))
    return callback, torch.cat([p.detach().flatten() for p in module.parameters()])


@pytest.mark.parametrize("method", [DPSGD, DPCert])
def test_ghost_and_vmap_engines_train_to_the_same_parameters(tmp_path, method):
    vmap_callback, vmap_params = train(tmp_path, "vmap", method)
    ghost_callback, ghost_params = train(tmp_path, "ghost", method)
    assert isinstance(vmap_callback._clipper, PerExampleClipper)
    assert isinstance(ghost_callback._clipper, GhostClipper)
    torch.testing.assert_close(ghost_params, vmap_params, rtol=1e-4, atol=1e-5)
    assert ghost_callback.ledger.history == vmap_callback.ledger.history


class UnfreezeConvolutions(BaseFinetuning):
    """The convolutions frozen before training and unfrozen, with a parameter group of their own, at the second
    epoch (Lightning's ``BackboneFinetuning`` does so with a module's ``backbone``)."""

    def freeze_before_training(self, pl_module: L.LightningModule) -> None:
        self.freeze([pl_module.model.net.conv1, pl_module.model.net.conv2])

    def finetune_function(self, pl_module: L.LightningModule, epoch: int, optimizer) -> None:
        if epoch == 1:
            self.unfreeze_and_add_param_group([pl_module.model.net.conv1, pl_module.model.net.conv2], optimizer)


def test_layers_unfrozen_mid_training_train_as_under_the_vmap_engine(tmp_path):
    """The ghost engine plans its rules again when the trainable parameters change; before, the unfrozen
    convolutions got zero clipped sums (noise alone) from the ghost engine."""
    trained = {}
    for engine in ("vmap", "ghost"):
        L.seed_everything(0, verbose=False)
        module = DPSGD(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8), lr=0.5)
        initial = module.model.net.conv1.weight.detach().clone()
        callback = DPCallback(max_grad_norm=0.5, noise_multiplier=0.1, delta=1e-5, engine=engine, seed=0)
        trainer = quiet_trainer(
            tmp_path, max_epochs=2, limit_train_batches=2, callbacks=[UnfreezeConvolutions(), callback]
        )
        trainer.fit(module, digits(batch_size=64))
        assert callback.ledger.steps == 4
        trained[engine] = torch.cat([p.detach().flatten() for p in module.parameters()])
        assert not torch.equal(module.model.net.conv1.weight, initial)
    torch.testing.assert_close(trained["ghost"], trained["vmap"], rtol=1e-4, atol=1e-5)


class MixedLogits(torch.nn.Module):
    """A linear layer whose logits are mixed by a matrix product with a parameter of the module that owns the layer:
    ``mix`` has no ghost rule and no graph capture, so ``engine="ghost"`` takes its per-example gradients from the
    vmap engine, restricted to it."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(64, 10)
        self.mix = torch.nn.Parameter(torch.eye(10) + 0.1 * torch.randn(10, 10))

    def forward(self, x):
        return self.linear(x.flatten(1)) @ self.mix


def test_ghost_with_a_vmap_fallback_trains_as_the_vmap_engine(tmp_path):
    """The fallback's per-example gradients depend on the parameters it leaves out (which require gradient): they
    must come back outside autograd's graph, or the noise cannot be added to them in place."""
    models = []
    for _ in range(2):
        torch.manual_seed(1)
        models.append(MixedLogits())
    vmap_callback, vmap_params = train(tmp_path, "vmap", model=models[0])
    ghost_callback, ghost_params = train(tmp_path, "ghost", model=models[1])
    assert ghost_callback._clipper.fallback_names == ["model.mix"]
    torch.testing.assert_close(ghost_params, vmap_params, rtol=1e-4, atol=1e-5)


def test_auto_picks_ghost_for_the_cnn_and_logs_the_choice(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        callback, _ = train(tmp_path, "auto")
    assert isinstance(callback._clipper, GhostClipper)
    assert "per-example clipping engine: ghost (auto" in caplog.text


def test_unknown_engine_is_refused():
    with pytest.raises(MisconfigurationException, match="engine='opacus'"):
        DPCallback(max_grad_norm=1.0, noise_multiplier=1.0, engine="opacus")
