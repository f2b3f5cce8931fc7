"""TransDenoiser: Tang, "Deep Learning with Differential Privacy and Adversarial Robustness", PhD thesis, Emory
University 2021, chapter 6 (a DP denoiser in front of a public classifier, certified by randomized smoothing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from lightning_dprobust.core.transdenoiser_math import secret_generator
from lightning_dprobust.data.validation import check_batch
from lightning_dprobust.methods.base import ClassifierModule, TrainInputs, renamed_seed
from lightning_dprobust.models import create_model

SLICES = ("first", "middle", "last")
"""The parameter slices ``theta_1``, ``theta_2``, ``theta_3`` of the thesis's App. .13."""


def load_public_classifier(
    classifier: str | nn.Module,
    num_classes: int,
    input_shape: Sequence[int],
    pretrained: bool = True,
    owner: str = "TransDenoiser(classifier",
) -> nn.Module:
    """The frozen public classifier ``h``: a module, a zoo entry name, ``timm/<arch>`` (with timm's weights) or the
    ``.ckpt`` of a classifier fitted by ``dprobust fit`` (read with ``weights_only=True``).
    ``owner`` starts the error messages (the argument that named the classifier).

    Raises:
        ValueError: the name is neither a zoo entry nor a timm architecture, or the entry cannot be loaded (e.g. it
            is a recipe without weights: the message says how to build it), or the classifier does not take images
            of ``input_shape`` or predict ``num_classes`` classes (:func:`check_classifier_fits`).
    """
    if isinstance(classifier, nn.Module):
        return check_classifier_fits(classifier, num_classes, input_shape, f"{owner}={type(classifier).__name__})")
    if str(classifier).endswith(".ckpt"):  # a classifier fitted by `dprobust fit` (e.g. on the public half)
        from lightning_dprobust.methods.checkpoints import load_checkpoint_module

        try:
            module = load_checkpoint_module(classifier)
        except (FileNotFoundError, ValueError) as error:
            raise ValueError(f"{owner}={classifier!r}): {error}") from error
        return check_classifier_fits(module, num_classes, input_shape, f"{owner}={classifier!r})")
    if classifier.startswith("timm/"):
        return create_model(classifier, num_classes=num_classes, input_shape=input_shape, pretrained=pretrained)
    from lightning_dprobust import zoo

    names = {entry.name for entry in zoo.list_entries()}
    if classifier not in names:
        raise ValueError(
            f"{owner}={classifier!r}) is neither a zoo entry nor 'timm/<arch>': pass a public "
            "pre-trained classifier, e.g. 'mlp_tanh.erm_digits_public' (see `dprobust zoo list`)"
        )
    try:
        module = zoo.load(classifier)
    except zoo.ZooError as error:  # e.g. a recipe entry without weights yet
        raise ValueError(f"{owner}={classifier!r}): {error}") from error
    return check_classifier_fits(module, num_classes, input_shape, f"{owner}={classifier!r})")


def check_classifier_fits(module: nn.Module, num_classes: int, input_shape: Sequence[int], label: str) -> nn.Module:
    """Return ``module`` if it takes images of ``input_shape`` and predicts ``num_classes`` logits; else raise one
    ``ValueError`` starting with ``label`` (a classifier trained for another dataset).

    The input shape its hyperparameters record is compared first; then one forward pass of a blank image (in eval
    mode, without gradients; the module's mode is restored) must succeed and give ``num_classes`` logits.
    """
    shape = tuple(int(s) for s in input_shape)
    fix = "it was trained for another dataset: pass a classifier trained on this data"
    recorded = (getattr(module, "hparams", None) or {}).get("input_shape")
    if recorded is not None and tuple(recorded) != shape:
        raise ValueError(f"{label} takes inputs of shape {tuple(recorded)} but the data has {shape}: {fix}")
    parameter = next(module.parameters(), None)
    blank = torch.zeros(1, *shape, device=None if parameter is None else parameter.device)
    training = module.training
    try:
        with torch.no_grad():
            logits = module.eval()(blank)
    except RuntimeError as error:
        reason = " ".join(str(error).split())
        raise ValueError(f"{label} does not take inputs of shape {shape} ({reason}): {fix}") from error
    finally:
        module.train(training)
    if not isinstance(logits, torch.Tensor) or logits.shape != (1, num_classes):
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        classes = f"{got[-1]} classes" if isinstance(got, tuple) and len(got) == 2 else f"an output of shape {got}"
        raise ValueError(f"{label} predicts {classes} but the data has {num_classes}: {fix}")
    return module


class TransDenoiser(ClassifierModule):
    """Trains a denoiser ``g`` on private data in front of a frozen public classifier ``h``; ``forward = h(g(x))``.

    Each training example is perturbed as ``z_i = x_i + N(0, sigma^2 I)`` (fresh noise at every step, Algorithm 3
    line 7) and ``g`` minimizes ``||g(z_i) - x_i||^2`` (Eq. 6.1; no stability term). Randomized smoothing of
    ``h(g(.))`` with the same ``sigma`` then certifies an L2 radius (Cohen et al. 2019): certify the module itself.

    Ablations of the thesis (section 6.3.2):

    * ``nodp``: train without a DP callback (input perturbation only, no privacy);
    * ``sepdp``: ``TransDenoiserCallback(mode="sepdp")``: plain Gaussian gradient noise ``xi_up`` on every slice;
    * ``transdenoiser``: ``TransDenoiserCallback(mode="transdenoiser")``: the input noise is transformed into
      gradient noise and only the missing part is added (Algorithm 3).

    Guarantees:
        ``h`` is never trained: its parameters have ``requires_grad=False`` and it stays in eval mode, so the
        optimizer, the per-example engine and the DP noise touch the denoiser only. The input noise comes from a
        generator keyed by a 128-bit secret from the operating system's entropy, all of whose bits set its state
        (:func:`~lightning_dprobust.core.transdenoiser_math.secret_generator`), independent of ``seed_everything``
        (the thesis counts it as privacy noise; the guarantee recorded does not); ``seed`` is a warned test
        mode.

    Args:
        classifier: the public classifier ``h``: a zoo entry name, ``"timm/<arch>"`` (timm's pretrained weights), or a
            module mapping ``[0, 1]`` images to logits. The pipeline ``h(g(x))`` is private only if ``h`` never saw
            the private data: the default ``"mlp_tanh.erm_digits_public"`` was trained on the public half of digits'
            training split, so train the denoiser on the other half (``DigitsDataModule(train_part="private")``).
        denoiser: registry name of ``g`` (default ``"dncnn_gn"``); its first / middle / last parameter-owning
            modules are the slices.
        denoiser_kwargs: arguments of the denoiser's constructor (e.g. ``{width: 32, depth: 5}``).
        sigma: std of the Gaussian input noise, in pixel units; certify with the same sigma.
        sigma_schedule: ``"constant"`` (the thesis) or ``"ramp"`` (the authors' code: from ``sigma_start``,
            multiplied by ``1 + ramp_rate`` per step, up to ``sigma``).
        sigma_start: first sigma of the ramp. ramp_rate: growth per step of the ramp.
        seed: fixed seed of the input noise (test mode, warned); ``noise_seed`` is its deprecated name.
        mean: ignored (linked from the data module): the denoiser works on ``[0, 1]`` images and ``h`` carries its
            own normalization. std: ignored, as ``mean``.
        **kwargs: see :class:`~lightning_dprobust.methods.base.ClassifierModule` (``optimizer``, ``lr``, ...).

    Example:
        >>> import torch
        >>> from lightning_dprobust.methods import TransDenoiser
        >>> h = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
        >>> module = TransDenoiser(classifier=h, input_shape=(1, 8, 8), sigma=0.25)
        >>> module(torch.rand(2, 1, 8, 8)).shape
        torch.Size([2, 10])
    """

    def __init__(
        self,
        classifier: str | nn.Module = "mlp_tanh.erm_digits_public",
        denoiser: str = "dncnn_gn",
        denoiser_kwargs: dict[str, Any] | None = None,
        sigma: float = 0.25,
        sigma_schedule: Literal["constant", "ramp"] = "constant",
        sigma_start: float | None = None,
        ramp_rate: float = 1.5e-4,
        seed: int | None = None,
        optimizer: Literal["sgd", "adam", "adamw"] = "adam",
        lr: float = 1e-3,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        noise_seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        seed = renamed_seed("TransDenoiser", "noise_seed", noise_seed, seed)
        _check_noise(sigma, sigma_schedule, sigma_start, ramp_rate)
        # the denoiser maps [0, 1] images to [0, 1] images: no normalization (the classifier carries its own)
        super().__init__(model=denoiser, model_kwargs=denoiser_kwargs, optimizer=optimizer, lr=lr, **kwargs)
        # the base class saved every constructor argument; "model" duplicates "denoiser", and a module is no YAML
        for key in ("model", "model_kwargs") + (("classifier",) if isinstance(classifier, nn.Module) else ()):
            self.hparams.pop(key, None)
        self.hparams.pop("noise_seed", None)
        self.hparams["seed"] = seed  # under its one name, whichever name it was given
        self.classifier = load_public_classifier(classifier, self.num_classes, self.input_shape)
        self.classifier.requires_grad_(False).eval()
        self.sigma = float(sigma)
        self._seed = seed
        self._generator: torch.Generator | None = None
        self.val_acc = MulticlassAccuracy(num_classes=self.num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=self.num_classes, average="micro")

    # --------------------------------------------------------------------------------------------- model
    def forward(self, x: Tensor) -> Tensor:
        """Logits of ``h(g(x))``; for a certified prediction, smooth this module with noise ``sigma``."""
        return self.classifier(self.model(x))

    @property
    def denoiser(self) -> nn.Module:
        """The denoiser ``g`` (the base class's ``model``)."""
        return self.model

    def train(self, mode: bool = True) -> TransDenoiser:
        """Set the denoiser's mode; the public classifier always stays in eval mode."""
        super().train(mode)
        self.classifier.eval()
        return self

    def on_train_end(self) -> None:
        """Say so when the denoiser was trained without a DP callback (the ``nodp`` ablation)."""
        if self.private_step is None:
            rank_zero_info("TransDenoiser: trained without TransDenoiserCallback (nodp): NOT private, epsilon = inf")

    def parameter_slices(self) -> dict[str, list[str]]:
        """Names (relative to the module) of the denoiser's trainable parameters in each slice.

        ``first``: the parameters of the first parameter-owning submodule of ``g``; ``last``: those of the last;
        ``middle``: every other one. The slices are disjoint and cover all of ``g``'s trainable parameters.
        """
        owners: list[list[str]] = []
        for module_name, module in self.model.named_modules():
            prefix = f"model.{module_name}." if module_name else "model."
            names = [prefix + name for name, p in module.named_parameters(recurse=False) if p.requires_grad]
            if names:
                owners.append(names)
        if len(owners) < 3:
            raise ValueError(f"the denoiser needs >= 3 parameter-owning layers to slice, found {len(owners)}")
        middle = [name for names in owners[1:-1] for name in names]
        return {"first": owners[0], "middle": middle, "last": owners[-1]}

    # ----------------------------------------------------------------------------------------- training
    def current_sigma(self) -> float:
        """The input-noise std at the current step (constant, or the ramp's value)."""
        hp = self.hparams
        if hp.sigma_schedule == "constant":
            return self.sigma
        start = hp.sigma_start if hp.sigma_start is not None else self.sigma / 5
        return min(self.sigma, start * (1.0 + hp.ramp_rate) ** self.global_step)

    def input_noise(self, x: Tensor, sigma: float) -> Tensor:
        """``N(0, sigma^2 I)`` shaped like ``x``, from the module's secret generator (a new secret per device)."""
        if self._generator is None or self._generator.device != x.device:
            self._generator = secret_generator(self._seed, x.device)
        return sigma * torch.randn(x.shape, generator=self._generator, device=x.device, dtype=x.dtype)

    def training_inputs(self, batch: Any) -> TrainInputs:
        """``(x, z)`` with ``z = x + N(0, sigma_t^2 I)`` drawn per example."""
        x, _ = batch
        return x, x + self.input_noise(x, self.current_sigma())

    def denoising_loss(self, inputs: Tensor, targets: Tensor) -> Tensor:
        """``||g(inputs_i) - targets_i||^2`` per example (Eq. 6.1). Shape: ``[B, C, H, W]`` twice -> ``[B]``."""
        return (self.model(inputs) - targets).pow(2).flatten(1).sum(1)

    def per_example_loss(self, x: Tensor, z: Tensor) -> Tensor:
        """The training loss of each example: ``||g(z_i) - x_i||^2``."""
        return self.denoising_loss(z, x)

    def _evaluate(self, batch: Any, stage: str, accuracy: MulticlassAccuracy) -> None:
        """Accuracy of ``h(g(x + noise))`` (the smoothed classifier's base prediction) and the denoising MSE."""
        x, y = batch
        check_batch(x, y, self.num_classes, self.input_shape)
        generator = torch.Generator(device=x.device).manual_seed(0)
        z = x + self.sigma * torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        denoised = self.model(z)
        accuracy.update(self.classifier(denoised), y)
        self.log(f"{stage}/mse", (denoised - x).pow(2).flatten(1).sum(1).mean(), sync_dist=True)
        self.log(f"{stage}/acc", accuracy, prog_bar=True)

    def configure_optimizers(self) -> Any:
        """One optimizer whose three parameter groups are the slices (Adam and SGD update each group on its own)."""
        hp = self.hparams
        named = dict(self.named_parameters())
        groups = [{"params": [named[n] for n in names], "slice": key} for key, names in self.parameter_slices().items()]
        kwargs: dict[str, Any] = {"lr": hp.lr, "weight_decay": hp.weight_decay}
        if hp.optimizer == "sgd":
            kwargs["momentum"] = hp.momentum
        optimizers = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
        return optimizers[hp.optimizer](groups, **kwargs)


def _check_noise(sigma: float, schedule: str, sigma_start: float | None, ramp_rate: float) -> None:
    if not (isinstance(sigma, (int, float)) and sigma > 0):
        raise ValueError(f"TransDenoiser(sigma={sigma!r}) must be > 0: the input noise std in pixel units, e.g. 0.25")
    if schedule not in ("constant", "ramp"):
        raise ValueError(f"TransDenoiser(sigma_schedule={schedule!r}) must be 'constant' or 'ramp'")
    if sigma_start is not None and not 0 < sigma_start <= sigma:
        raise ValueError(f"TransDenoiser(sigma_start={sigma_start!r}) must lie in (0, sigma={sigma}]")
    if not ramp_rate > 0:
        raise ValueError(f"TransDenoiser(ramp_rate={ramp_rate!r}) must be > 0")


__all__ = ["SLICES", "TransDenoiser", "check_classifier_fits", "load_public_classifier"]
