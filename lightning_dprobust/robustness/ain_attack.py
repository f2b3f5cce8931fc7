"""A trained AIN generator as a torchattacks ``Attack`` (Tang 2021, PhD thesis, Emory University, chapter 5).

:class:`AINAttack` turns clean images into adversarial ones with one forward pass of the generator; it is
example-separable (registered in :data:`~lightning_dprobust.robustness.separability.SEPARABLE_ATTACKS`): example
``i``'s output is a function of ``x[i]``, its conditioning label (the attacked model's prediction on ``x[i]``, or
``y[i]``), the frozen generator and noise drawn from the attack's own ``generator``, so it runs on private training
data (``AdversarialAugmentation``, ``DPAdv``).

The generator is conditioned on a class label (thesis section 5.2.2). An attacker does not know the true label of the
image it perturbs, so by default the label is the attacked model's prediction (``condition="prediction"``);
``condition="true_label"`` conditions on the label passed to the attack, which gives the attack information a
label-free attacker lacks and overstates its success on misclassified examples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torchattacks.attack import Attack

from lightning_dprobust.checkpoint_io import read_checkpoint
from lightning_dprobust.models.ain import AINGenerator

AIN_CLASS = "lightning_dprobust.methods.ain:AIN"
"""The class an AIN checkpoint names (``dprobust_class``)."""
Condition = Literal["prediction", "true_label"]
CONDITIONS: tuple[str, ...] = ("prediction", "true_label")
"""What an AIN is conditioned on at attack time: the attacked model's prediction (default) or the true label."""


def load_ain_generator(source: str | AINGenerator) -> AINGenerator:
    """The generator of ``source``: an :class:`AINGenerator` (returned as it is), or, frozen, the one of a ``.ckpt``
    written by fitting ``AIN`` or of a zoo entry of kind ``attack``. Checkpoints are read with ``weights_only=True``;
    nothing is imported from them.

    Raises:
        ValueError: the checkpoint was not written by ``AIN``, or the zoo entry is not of kind ``attack``.
        FileNotFoundError: ``source`` is neither a file nor a zoo entry.
    """
    if isinstance(source, AINGenerator):
        return source  # used as it is (the attack runs it without gradients; its layers act the same in any mode)
    if Path(source).suffix == ".ckpt" or Path(source).exists():
        generator = _from_checkpoint(Path(source))
    else:
        generator = _from_zoo(source)
    return generator.requires_grad_(False).eval()


def _from_checkpoint(path: Path) -> AINGenerator:
    if not path.is_file():
        raise FileNotFoundError(
            f"AIN checkpoint {path} does not exist: pass an AIN .ckpt or a zoo entry of kind attack"
        )
    checkpoint = read_checkpoint(path)
    if checkpoint.get("dprobust_class") != AIN_CLASS:
        raise ValueError(
            f"{path} was not written by AIN (it names {checkpoint.get('dprobust_class')!r}): train one "
            "with `dprobust fit --config configs/ain/digits.yaml` or use a zoo entry of kind attack"
        )
    hp = checkpoint["hyper_parameters"]
    generator = AINGenerator(
        hp["num_classes"], hp["input_shape"], noise_std=hp["noise_std"], **(hp.get("generator_kwargs") or {})
    )
    state = {k[len("model.") :]: v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")}
    generator.load_state_dict(state)
    return generator


def _from_zoo(name: str) -> AINGenerator:
    from lightning_dprobust import zoo

    if zoo.info(name).kind != "attack":
        raise ValueError(
            f"zoo entry {name!r} is a {zoo.info(name).kind}, not an attack: pick one of kind attack "
            "(`dprobust zoo list`)"
        )
    return zoo.load(name)


class AINAttack(Attack):
    """Adversarial examples from a trained AIN generator: ``x' = clip(x + clip(z, -eps, eps), 0, 1)``.

    Guarantees: ``||x' - x||_inf <= eps`` and ``x'`` in ``[0, 1]``. Example ``i``'s output depends on ``x[i]``, its
    conditioning label (``condition="prediction"``: ``model``'s prediction on ``x[i]``; ``"true_label"``:
    ``labels[i]``), the generator and its own noise draws, taken from this attack's ``generator`` (never the global
    RNG). With ``n_samples > 1`` each example keeps the first of its draws that ``model`` misclassifies (``labels``
    taken as the truth; targeted AIN: classified as the AIN's target class), else its last draw.

    Assumptions: the AIN was trained down to a bound ``B_final`` (its buffer ``bound``); ``eps >= B_final`` (thesis
    section 5.2.3): a smaller ``eps`` is refused.

    Args:
        model: the classifier under attack (used for ``n_samples > 1`` and by torchattacks for device and modes).
        ain: an :class:`~lightning_dprobust.models.AINGenerator`, an AIN ``.ckpt`` or a zoo entry of kind attack.
        eps: the Linf bound used at inference (pixel units).
        n_samples: noise draws tried per example. seed: seed of the attack's own noise generator.
        condition: ``"prediction"`` (default: what an attacker without labels can do) or ``"true_label"``.

    Raises:
        ValueError: ``eps`` below the trained bound or not finite, ``n_samples < 1``, an unknown ``condition``.
    """

    def __init__(
        self,
        model: nn.Module,
        ain: str | AINGenerator,
        eps: float,
        n_samples: int = 1,
        seed: int = 0,
        condition: Condition = "prediction",
    ) -> None:
        super().__init__("AIN", model)
        if condition not in CONDITIONS:
            raise ValueError(f"AINAttack(condition={condition!r}) is unknown: choose one of {CONDITIONS}")
        self.condition = condition
        self.ain = load_ain_generator(ain)
        trained = float(self.ain.bound)
        if not (math.isfinite(eps) and eps >= 0) or n_samples < 1:
            raise ValueError(
                f"AINAttack needs a finite eps >= 0 and n_samples >= 1, got eps={eps}, n_samples={n_samples}"
            )
        if eps < trained - 1e-6:
            raise ValueError(
                f"AINAttack(eps={eps:g}) is below the bound {trained:.4g} this AIN was trained down to: use "
                f"eps >= {trained:.4g}, or train an AIN to a smaller bound (min_bound)"
            )
        self.eps, self.n_samples = float(eps), int(n_samples)
        self.generator = torch.Generator().manual_seed(seed)
        self.supported_mode = ["default"]

    @property
    def target_class(self) -> int | None:
        """The class a targeted AIN aims at (``None``: untargeted)."""
        value = int(self.ain.target_class)
        return None if value < 0 else value

    def generate(
        self, x: Tensor, bound: float | None = None, n_samples: int = 1, labels: Tensor | None = None
    ) -> Tensor:
        """``n_samples`` diverse adversarial versions of each image: ``[n_samples, B, C, H, W]``.

        ``labels`` (the conditioning label itself) defaults to ``model``'s prediction; ``bound`` defaults to ``eps``.
        """
        bound = self.eps if bound is None else float(bound)
        if bound < float(self.ain.bound) - 1e-6:
            raise ValueError(f"generate(bound={bound:g}) is below the trained bound {float(self.ain.bound):.4g}")
        x = x.to(self.device)
        labels = self._predicted(x) if labels is None else labels.to(self.device)
        return torch.stack([self._draw(x, labels, bound) for _ in range(n_samples)])

    def conditioning_labels(self, images: Tensor, labels: Tensor) -> Tensor:
        """The labels the generator is conditioned on: ``model``'s predictions, or ``labels`` (``"true_label"``)."""
        return labels if self.condition == "true_label" else self._predicted(images)

    def _predicted(self, images: Tensor) -> Tensor:
        with torch.no_grad():
            return self.get_logits(images).argmax(dim=1)

    def check_fits(self, input_shape: Sequence[int], num_classes: int, label: str = "the AIN generator") -> None:
        """Raise one ``ValueError`` starting with ``label`` unless the generator was built for images of
        ``input_shape`` and labels of ``num_classes`` classes (an AIN trained on another dataset)."""
        shape = tuple(int(s) for s in input_shape)
        if (self.ain.input_shape, self.ain.num_classes) != (shape, int(num_classes)):
            raise ValueError(
                f"{label} was trained on inputs of shape {self.ain.input_shape} with {self.ain.num_classes} classes, "
                f"but the attacked images have {shape} with {num_classes} classes: use an AIN trained on this data"
            )

    def _draw(self, x: Tensor, labels: Tensor, bound: float) -> Tensor:
        if tuple(x.shape[1:]) != self.ain.input_shape:
            self.check_fits(x.shape[1:], self.ain.num_classes)
        self.ain.to(x.device)
        with torch.no_grad():
            return self.ain(x, labels, bound, self.generator).detach()

    def forward(self, images: Tensor, labels: Tensor) -> Tensor:
        x, y = images.clone().detach().to(self.device), labels.clone().detach().to(self.device)
        condition = self.conditioning_labels(x, y)
        best = self._draw(x, condition, self.eps)
        if self.n_samples == 1:
            return best
        done = self._fooled(best, y)
        for _ in range(self.n_samples - 1):
            draw = self._draw(x, condition, self.eps)
            best = torch.where(done.view(-1, *([1] * (x.dim() - 1))), best, draw)
            done = done | self._fooled(draw, y)
        return best

    def _fooled(self, images: Tensor, labels: Tensor) -> Tensor:
        predicted = self._predicted(images)
        return predicted != labels if self.target_class is None else predicted == self.target_class


def success_rate(model: nn.Module, adversarial: Tensor, labels: Tensor, target_class: int | None) -> float:
    """Attack success rate as the thesis counts it (section 5.3): untargeted, the fraction ``model`` misclassifies;
    targeted, the fraction it classifies as ``target_class`` among the examples of other classes."""
    with torch.no_grad():
        predicted = model(adversarial).argmax(dim=1)
    if target_class is None:
        return (predicted != labels).float().mean().item()
    keep = labels != target_class
    return (predicted[keep] == target_class).float().mean().item()


def ain_attack(model: nn.Module, eps: float, ain: str | AINGenerator | None = None, **kwargs: Any) -> AINAttack:
    """Suite builder: :class:`AINAttack` on ``model`` with bound ``eps``; ``ain`` names the trained AIN; ``kwargs``
    go to :class:`AINAttack` (``n_samples``, ``seed``, ``condition``: the model's prediction unless told)."""
    if ain is None:
        raise ValueError(
            "the AIN attack needs a trained AIN: pass ain=<AIN .ckpt or zoo entry of kind attack> "
            "(`dprobust attack --attack AIN --ain NAME`)"
        )
    return AINAttack(model, ain, eps, **kwargs)


__all__ = ["AIN_CLASS", "CONDITIONS", "AINAttack", "Condition", "ain_attack", "load_ain_generator", "success_rate"]
