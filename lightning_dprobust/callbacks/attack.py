"""``AdversarialAugmentation``: adversarial views of each training batch from any torchattacks ``Attack``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor, nn
from torchattacks.attack import Attack

from lightning_dprobust.robustness.attacks import attack_guard
from lightning_dprobust.robustness.randomness import AttackRandomness, attack_seed
from lightning_dprobust.robustness.separability import training_attack

AttackSpec = Callable[[nn.Module], Attack] | dict[str, Any]
_MODES = ("replace", "group", "mix")


class AdversarialAugmentation(Callback):
    """Replaces or augments each training batch with adversarial examples (adversarial training).

    The attack runs as pre-processing of the batch inside the training step, on the unwrapped LightningModule
    (never on a DDP wrapper): the DP-Adv argument (Bu et al. 2021, https://arxiv.org/abs/2112.12497) that privacy
    comes from per-example clipping of the gradient at the adversarial example applies, since example ``i``'s
    adversarial view depends only on example ``i``, its label and the current parameters. Modes:

    * ``"replace"``: every image is replaced by its adversarial version (Madry et al. 2018,
      https://arxiv.org/abs/1706.06083; DP-Adv). With views ``[B, V, ...]`` each view is attacked.
    * ``"group"``: the adversarial view is added to the example's augmentation group: ``[B, C, H, W]`` becomes
      ``[B, 2, C, H, W]`` (clean, adversarial); ``[B, V, ...]`` becomes ``[B, V + 1, ...]`` with the adversarial
      version of view 0 appended. The method averages the views' losses per example, so ``DPCallback`` clips one
      gradient per example (DP-CERT, Wu et al. 2023, https://arxiv.org/abs/2306.08656).
    * ``"mix"``: each example is independently replaced by its adversarial version with probability
      ``mix_fraction`` (StoBatch, Phan et al. 2020, https://arxiv.org/abs/1906.06449); the batch size is unchanged.

    Guarantees:
        Example ``i``'s adversarial view is a function of example ``i`` alone: the attack goes through
        :func:`~lightning_dprobust.robustness.separability.training_attack`, which accepts example-separable attacks,
        runs CW one example at a time and refuses attacks that couple a batch (APGD, FAB, Square, AutoAttack, ...) or
        that it does not know. The attack draws from the callback's own stream (seeded by ``seed``) inside
        :func:`~lightning_dprobust.robustness.randomness.isolated_rng`: the global torch, NumPy and Python RNGs are
        exactly as before each attack, even for attacks that call ``torch.manual_seed``. The batch size, and so what
        ``DPCallback`` samples and accounts, never changes; an empty batch passes through unchanged. After each attack
        every submodule's train/eval mode is as before (a frozen eval submodule stays eval), each parameter's
        ``requires_grad`` and ``.grad`` are as before (``None`` stays ``None``), no ``grad_sample`` attribute is left on
        a parameter, and the returned tensors carry no graph.

    Assumptions:
        The module is a :class:`~lightning_dprobust.methods.base.ClassifierModule` (``train_input_transforms``,
        ``forward`` returning logits of ``[0, 1]`` images); the attack's budget is in pixel units.

    Args:
        attack: a factory ``model -> Attack`` called with the LightningModule at setup; a built ``Attack`` whose
            model is the LightningModule (or one of its submodules); or ``{"class_path": "torchattacks.PGD",
            "init_args": {"eps": 0.1}}``, built at setup with ``model=pl_module``. In YAML, ``class_path`` and
            ``init_args`` under ``attack`` become a factory: jsonargparse builds a callable for the annotation
            ``Callable[[nn.Module], Attack]``, and passes the dict where it cannot. ``Attack`` itself is left out
            of the annotation on purpose: jsonargparse would then instantiate the class with ``model=None``. The
            attack is moved to the module's device at fit start.
        mode: ``"replace"``, ``"group"`` or ``"mix"``.
        mix_fraction: probability of replacing each example in ``"mix"`` mode.
        attack_eval_mode: attack the model in eval mode (torchattacks' default). ``False`` runs it in training
            mode via ``set_model_training_mode(True, True, True)``, which torchattacks applies with
            ``model.train()`` (every submodule) during the attack; modes are restored afterwards either way.
        seed: seed of the callback's streams: the attack's randomness (random starts) and the examples picked in
            ``"mix"`` mode. Neither is secret: the privacy proof does not rely on them.

    Example:
        >>> import torchattacks
        >>> callback = AdversarialAugmentation(lambda model: torchattacks.PGD(model, eps=0.1, steps=3), mode="group")
    """

    def __init__(
        self,
        attack: AttackSpec,
        mode: Literal["replace", "group", "mix"] = "replace",
        mix_fraction: float = 0.5,
        attack_eval_mode: bool = True,
        seed: int = 0,
    ) -> None:
        if mode not in _MODES:
            raise MisconfigurationException(f"AdversarialAugmentation(mode={mode!r}) must be one of {_MODES}")
        if not 0.0 <= mix_fraction <= 1.0:
            raise MisconfigurationException(f"AdversarialAugmentation(mix_fraction={mix_fraction}) must lie in [0, 1]")
        if not (isinstance(attack, (Attack, dict)) or callable(attack)):
            raise MisconfigurationException(
                f"AdversarialAugmentation(attack=...) needs an Attack, a factory model -> Attack or a "
                f"class_path/init_args dict, got {type(attack).__name__}"
            )
        self.attack_spec = attack
        self.attack: Attack | None = attack if isinstance(attack, Attack) else None
        self.mode = mode
        self.mix_fraction = float(mix_fraction)
        self.attack_eval_mode = attack_eval_mode
        self.generator = torch.Generator().manual_seed(seed)
        self.randomness = AttackRandomness(attack_seed(seed, "AdversarialAugmentation"))

    # ----------------------------------------------------------------------------------------------- lifecycle
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if not hasattr(pl_module, "train_input_transforms"):
            raise MisconfigurationException(
                f"AdversarialAugmentation needs a module with `train_input_transforms` (got "
                f"{type(pl_module).__name__}): subclass lightning_dprobust.methods.ClassifierModule"
            )
        self.attack = self._build(pl_module)
        training = not self.attack_eval_mode
        self.attack.set_model_training_mode(training, training, training)
        if self._transform not in pl_module.train_input_transforms:
            pl_module.train_input_transforms.append(self._transform)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.attack.set_device(pl_module.device)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        transforms = getattr(pl_module, "train_input_transforms", [])
        if stage == "fit" and self._transform in transforms:
            transforms.remove(self._transform)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "attack_randomness": self.randomness.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.generator.set_state(state_dict["generator"])
        if "attack_randomness" in state_dict:
            self.randomness.load_state_dict(state_dict["attack_randomness"])

    # ------------------------------------------------------------------------------------------- the transform
    def _build(self, pl_module: L.LightningModule) -> Attack:
        spec = self.attack_spec
        if isinstance(spec, Attack):
            attack = spec
        elif isinstance(spec, dict):
            attack = _from_class_path(spec, pl_module)
        else:
            attack = spec(pl_module)
        if not isinstance(attack, Attack):
            raise MisconfigurationException(
                f"AdversarialAugmentation: the attack factory returned {type(attack).__name__}, not a torchattacks "
                "Attack"
            )
        if not any(attack.model is module for module in pl_module.modules()):
            raise MisconfigurationException(
                f"AdversarialAugmentation: the attack was built on a {type(attack.model).__name__} that is not the "
                "LightningModule or one of its submodules; pass a factory (e.g. `lambda model: PGD(model, ...)`) so "
                "that the attack is built on the module being trained"
            )
        try:
            return training_attack(attack)
        except ValueError as error:
            raise MisconfigurationException(f"AdversarialAugmentation: {error}") from error

    def _transform(self, module: L.LightningModule, inputs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        x, y, *rest = inputs
        if x.shape[0] == 0:
            return inputs
        image_dims = _image_dims(module)
        if x.dim() not in (image_dims, image_dims + 1):
            raise ValueError(
                f"AdversarialAugmentation expects images [B, C, H, W] or views [B, V, C, H, W], got {tuple(x.shape)}"
            )
        if self.mode == "replace":
            x = self._adversarial(module, x, y)
        elif self.mode == "group":
            clean = x if x.dim() == image_dims else x[:, 0]
            views = x.unsqueeze(1) if x.dim() == image_dims else x
            x = torch.cat([views, self._adversarial(module, clean, y).unsqueeze(1)], dim=1)
        else:
            chosen = (torch.rand(x.shape[0], generator=self.generator) < self.mix_fraction).nonzero().flatten()
            if chosen.numel():
                chosen = chosen.to(x.device)
                x = x.index_copy(0, chosen, self._adversarial(module, x[chosen], y[chosen]))
        return (x, y, *rest)

    def _adversarial(self, module: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        """Adversarial version of every image in ``x`` (``[N, *S]`` or views ``[N, V, *S]``), label ``y[n]``."""
        views = 1 if x.dim() == _image_dims(module) else x.shape[1]
        images = x.detach().flatten(0, x.dim() - _image_dims(module))
        with attack_guard(module):
            if self.attack_eval_mode:
                module.eval()
            adversarial = self.randomness.run(self.attack, images, y.detach().repeat_interleave(views, dim=0))
        return adversarial.view_as(x)


def _image_dims(module: nn.Module) -> int:
    """Dimensions of a batch of images, ``[B, C, H, W]``: one more than the module's ``input_shape``."""
    return len(getattr(module, "input_shape", (0, 0, 0))) + 1


def _from_class_path(spec: dict[str, Any], pl_module: nn.Module) -> Attack:
    class_path = spec.get("class_path")
    if not isinstance(class_path, str) or "." not in class_path or set(spec) - {"class_path", "init_args"}:
        raise MisconfigurationException(
            "AdversarialAugmentation(attack=dict) must look like {'class_path': 'torchattacks.PGD', 'init_args': "
            f"{{'eps': 0.1}}}}, got {spec}"
        )
    module_name, _, name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module_name), name, None)
    if not (isinstance(cls, type) and issubclass(cls, Attack)):
        raise MisconfigurationException(f"AdversarialAugmentation: {class_path} is not a torchattacks Attack class")
    return cls(pl_module, **spec.get("init_args", {}))


__all__ = ["AdversarialAugmentation"]
