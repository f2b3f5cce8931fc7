"""StoBatch's noise draw is secret: never in a state dict or a shipped weights file, kept in training checkpoints;
the released network's predictions do not depend on it (docs/design.md, contract 8)."""

from __future__ import annotations

import pytest
import torch

from lightning_dprobust.methods import StoBatch
from lightning_dprobust.models.stobatch import StoBatchNet
from lightning_dprobust.zoo.hub import Zoo, read_state_dict
from tests.helpers import digits, quiet_trainer

SECRET = ("input_noise", "input_draws", "hidden_noise", "label_noise", "noise_drawn")
NET_SECRET = ("hidden_noise", "label_noise", "noise_drawn")


def module(**kwargs) -> StoBatch:
    defaults = dict(batch_size=120, attack_steps=1, num_classes=10, input_shape=(1, 8, 8))
    return StoBatch(**(defaults | kwargs))


def leaked(state: dict[str, torch.Tensor]) -> list[str]:
    return [key for key in state if key.rsplit(".", 1)[-1] in SECRET]


def test_shipped_stobatch_weights_hold_no_noise():
    zoo = Zoo()
    shipped = [e for e in zoo.list_entries("stobatch_cnn.*") if e.status == "shipped"]
    assert len(shipped) >= 1
    for entry in shipped:
        state = read_state_dict(zoo.catalog_dir / entry.url)
        assert "net.encoder.weight" in state
        assert leaked(state) == [], f"{entry.name} ships the secret noise draw"
        zoo.load(entry.name)  # loads exactly, without the draw


def test_state_dict_holds_no_noise_and_the_checkpoint_keeps_it(tmp_path):
    sto = module()
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=2, enable_checkpointing=True)
    trainer.fit(sto, digits())
    assert bool(sto.net.noise_drawn) and sto.input_draws.abs().sum() > 0
    assert leaked(sto.state_dict()) == [] and leaked(sto.model.state_dict()) == []
    checkpoint = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=True)
    assert leaked(checkpoint["state_dict"]) == []
    assert torch.equal(checkpoint["stobatch_noise"]["hidden_noise"], sto.net.hidden_noise)
    assert torch.equal(checkpoint["stobatch_input_noise"], sto.input_draws)
    private = StoBatch.load_from_checkpoint(
        trainer.checkpoint_callback.best_model_path, inference_noise="training_draw"
    )
    assert all(torch.equal(getattr(private.net, name), getattr(sto.net, name)) for name in NET_SECRET)
    assert torch.equal(private.input_draws, sto.input_draws)
    x = torch.rand(8, 1, 8, 8)
    sto.net.inference_noise = "training_draw"
    assert torch.equal(private.eval()(x), sto.eval()(x))  # the paper's inference from the private checkpoint


def twins(normalization: str = "none") -> tuple[StoBatch, StoBatch, torch.Tensor]:
    """Two modules with the same weights and different draws, in eval mode, and a batch of inputs."""
    first, second = (module(model_kwargs={"normalization": normalization}) for _ in range(2))
    second.load_state_dict(first.state_dict())
    first.draw_noise(torch.Generator().manual_seed(0))
    second.draw_noise(torch.Generator().manual_seed(1))
    data = digits()
    data.setup("fit")
    return first.eval(), second.eval(), data.train_set.tensors[0][:64]


@torch.no_grad()
def test_released_predictions_do_not_depend_on_the_training_draw():
    first, second, x = twins()
    bare = StoBatchNet(num_classes=10, input_shape=(1, 8, 8)).eval()
    bare.load_state_dict(first.net.state_dict())
    assert torch.equal(first(x), second(x)) and torch.equal(first(x), bare(x))
    scores = [sto.pixeldp_scores(x, 3, torch.Generator().manual_seed(5)) for sto in (first, second)]
    assert torch.equal(*scores)
    for sto in (first, second):
        sto.net.inference_noise = "training_draw"
    assert torch.equal(first(x), second(x))  # no input offset is reused (one draw per batch); "none" reads no h_bar
    first, second, x = twins("batch")
    for sto in (first, second):
        sto.net.inference_noise = "training_draw"
    assert not torch.allclose(first(x), second(x))  # the paper's mode reads the hidden draw
    assert not torch.allclose(*(sto.pixeldp_scores(x, 3, torch.Generator().manual_seed(5)) for sto in (first, second)))


@torch.no_grad()
def test_released_mode_leaves_the_running_statistics_alone():
    first = module(model_kwargs={"normalization": "batch"}).eval()
    x = torch.rand(8, 1, 8, 8)
    norm = first.net.body[1]
    before = (norm.running_mean.clone(), norm.running_var.clone(), int(norm.num_batches_tracked))
    first(x)
    assert torch.equal(norm.running_mean, before[0]) and torch.equal(norm.running_var, before[1])
    assert int(norm.num_batches_tracked) == before[2]


def test_training_draw_mode_needs_the_draw_and_modes_are_checked():
    bare = StoBatchNet(num_classes=10, input_shape=(1, 8, 8), inference_noise="training_draw").eval()
    with pytest.raises(RuntimeError, match="holds none"):
        bare(torch.rand(4, 1, 8, 8))
    with pytest.raises(ValueError, match="at least 2 examples"):
        StoBatchNet(num_classes=10, input_shape=(1, 8, 8), normalization="batch").eval()(torch.rand(1, 1, 8, 8))
    for build in (
        lambda: module(inference_noise="paper"),
        lambda: StoBatchNet(num_classes=10, input_shape=(1, 8, 8), inference_noise="x"),
    ):
        with pytest.raises(ValueError, match="inference_noise") as error:
            build()
        assert "\n" not in str(error.value)


def test_a_logger_that_uploads_checkpoints_is_refused(tmp_path):
    """The training checkpoint keeps the draw; W&B's ``log_model`` would publish it with the logs."""
    from lightning.pytorch.loggers import WandbLogger

    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_train_batches=1)
    logger = WandbLogger(save_dir=tmp_path, log_model="all")
    trainer.loggers = [logger]
    sto = module()
    with pytest.raises(ValueError, match=r"log_model='all'\) would upload .* secret Laplace noise draw"):
        trainer.fit(sto, digits())
    logger.experiment.finish()  # Lightning started the run before the refusal; a live run would capture later loggers
    assert not bool(sto.net.noise_drawn)  # refused before anything was drawn
