"""Adversarial attack suite, robust accuracy, and SmoothAdv (the attack on a Gaussian-smoothed classifier).

The suite wraps torchattacks 3.5.1 (Kim 2020, https://arxiv.org/abs/2010.01950). Budgets are in pixel units: data
modules yield images in ``[0, 1]`` and every model normalizes its inputs in its first layer (design, contract 1),
so no ``set_normalization_used`` is needed.

torchattacks' ``Attack.__call__`` puts the model in eval mode and then calls ``model.train()``, which sets *every*
submodule to training mode, including submodules the user froze in eval mode. :func:`preserve_modes` records each
submodule's flag and restores it exactly; :func:`attack_guard` adds what training-time attacks need on top.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
import torchattacks
from torch import Tensor, nn
from torchattacks.attack import Attack

from lightning_dprobust.metrics import RobustAccuracy
from lightning_dprobust.robustness.randomness import AttackRandomness, attack_seed
from lightning_dprobust.robustness.reports import markdown_table

AttackBuilder = Callable[..., Attack]

_AUTOATTACK_PARTS = ("apgd-ce", "apgd-dlr", "apgd-t", "fab-t", "square")
_SAMPLE_ATTRS = ("grad_sample", "grad_sample_stack")


# ------------------------------------------------------------------------------------------------- the suite
def _pgd_step(eps: float, steps: int) -> float:
    """Step size ``2.5 eps / steps`` of Madry et al. 2018 (https://arxiv.org/abs/1706.06083)."""
    return 2.5 * eps / steps


def _even_step(eps: float, steps: int) -> float:
    """Step size ``eps / steps``: the budget is exactly used up after ``steps`` steps (Kurakin, Dong)."""
    return eps / steps


def _iterative(cls: type[Attack], step_rule: Callable[[float, int], float]) -> AttackBuilder:
    def build(model: nn.Module, eps: float, steps: int = 10, alpha: float | None = None, **kwargs: Any) -> Attack:
        if steps < 1:
            raise ValueError(f"{cls.__name__} needs steps >= 1, got {steps}")
        return cls(model, eps=eps, steps=steps, alpha=step_rule(eps, steps) if alpha is None else alpha, **kwargs)

    return build


def _cw(model: nn.Module, eps: float, steps: int = 50, c: float = 1.0, kappa: float = 0.0, lr: float = 0.01) -> Attack:
    if steps < 1:
        raise ValueError(f"CW needs steps >= 1, got {steps}")
    return torchattacks.CW(model, c=c, kappa=kappa, steps=steps, lr=lr)


def _autoattack(
    model: nn.Module,
    eps: float,
    version: str = "standard",
    n_classes: int = 10,
    seed: int = 0,
    attacks_to_run: Sequence[str] = ("apgd-ce", "apgd-t"),
    steps: int = 10,
    n_queries: int = 5000,
) -> Attack:
    if version != "custom":
        return torchattacks.AutoAttack(model, norm="Linf", eps=eps, version=version, n_classes=n_classes, seed=seed)
    unknown = sorted(set(attacks_to_run) - set(_AUTOATTACK_PARTS))
    if unknown or not attacks_to_run:
        raise ValueError(f"AutoAttack(version='custom') runs a non-empty subset of {_AUTOATTACK_PARTS}, got {unknown}")
    common = dict(norm="Linf", eps=eps, seed=seed)
    parts = {
        "apgd-ce": lambda: torchattacks.APGD(model, steps=steps, loss="ce", **common),
        "apgd-dlr": lambda: torchattacks.APGD(model, steps=steps, loss="dlr", **common),
        "apgd-t": lambda: torchattacks.APGDT(model, steps=steps, n_classes=n_classes, **common),
        "fab-t": lambda: torchattacks.FAB(model, steps=steps, multi_targeted=True, n_classes=n_classes, **common),
        "square": lambda: torchattacks.Square(model, n_queries=n_queries, **common),
    }
    chosen = [parts[name]() for name in attacks_to_run]
    return chosen[0] if len(chosen) == 1 else torchattacks.MultiAttack(chosen)


ATTACKS: dict[str, AttackBuilder] = {
    "FGSM": lambda model, eps, **kwargs: torchattacks.FGSM(model, eps=eps, **kwargs),
    "PGD": _iterative(torchattacks.PGD, _pgd_step),
    "PGDL2": _iterative(torchattacks.PGDL2, _pgd_step),
    "BIM": _iterative(torchattacks.BIM, _even_step),
    "MIFGSM": _iterative(torchattacks.MIFGSM, _even_step),
    "MIM": _iterative(torchattacks.MIFGSM, _even_step),
    "CW": _cw,
    "AUTOATTACK": _autoattack,
    "AIN": lambda model, eps, ain=None, n_samples=1, seed=0: _ain_attack(model, eps, ain, n_samples, seed),
}
"""Builders by upper-case name; ``MIM`` is an alias of ``MIFGSM``."""


def _ain_attack(model: nn.Module, eps: float, ain: Any, n_samples: int, seed: int) -> Attack:
    from lightning_dprobust.robustness.ain_attack import ain_attack

    return ain_attack(model, eps, ain, n_samples=n_samples, seed=seed)


#: Attacks whose budget is an L2 radius; the others are Linf (CW has no budget).
L2_ATTACKS = frozenset({"PGDL2"})


def build_attack(name: str, model: nn.Module, eps: float, **kwargs: Any) -> Attack:
    """Build a suite attack on ``model`` with budget ``eps`` (pixel units, inputs in ``[0, 1]``).

    ========== ====== ============================================================================================
    name       norm   defaults and extra keyword arguments
    ========== ====== ============================================================================================
    FGSM       Linf   Goodfellow et al. 2015, https://arxiv.org/abs/1412.6572
    PGD        Linf   Madry et al. 2018, https://arxiv.org/abs/1706.06083; ``steps=10``, ``alpha=2.5 eps/steps``,
                      random start
    PGDL2      L2     as PGD with an L2 ball of radius ``eps``
    BIM        Linf   Kurakin et al. 2017, https://arxiv.org/abs/1607.02533; ``steps=10``, ``alpha=eps/steps``
    MIFGSM/MIM Linf   Dong et al. 2018, https://arxiv.org/abs/1710.06081; ``steps=10``, ``alpha=eps/steps``,
                      ``decay=1.0``
    CW         L2     Carlini and Wagner 2017, https://arxiv.org/abs/1608.04644; minimizes the perturbation size
                      instead of using a budget, so ``eps`` is **ignored**; ``c=1``, ``kappa=0``, ``steps=50``,
                      ``lr=0.01``; its early stop looks at the batch-summed cost, so on training data it runs one
                      example at a time (:mod:`lightning_dprobust.robustness.separability`)
    AutoAttack Linf   Croce and Hein 2020, https://arxiv.org/abs/2003.01690; ``version`` ``"standard"`` (APGD-CE,
                      APGD-T, FAB-T, Square with 5,000 queries: slow), ``"plus"``, ``"rand"``, or ``"custom"``
                      with ``attacks_to_run`` (subset of ``apgd-ce, apgd-dlr, apgd-t, fab-t, square``), ``steps``
                      and ``n_queries``, which only ``"custom"`` uses; ``n_classes=10``, ``seed=0``
    AIN        Linf   Tang 2021 (PhD thesis, chapter 5): a trained generator, ``ain=<AIN .ckpt or zoo entry of kind
                      attack>`` (required), ``n_samples=1``, ``seed=0``; ``eps`` >= the bound it was trained to
    ========== ====== ============================================================================================

    Names are case-insensitive. Every returned attack maps ``[0, 1]`` images to ``[0, 1]`` images; all but CW stay
    within the ``eps`` ball of their norm.

    Raises:
        ValueError: for an unknown name (the message lists the valid names) or invalid ``steps``/``version``.
    """
    builder = ATTACKS.get(name.upper())
    if builder is None:
        raise ValueError(f"unknown attack {name!r}: choose one of {sorted(ATTACKS)} (case-insensitive)")
    if not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be a finite number >= 0 in pixel units, got {eps}")
    return builder(model, eps, **kwargs)


# ------------------------------------------------------------------------------------------------ isolation
@contextmanager
def preserve_modes(model: nn.Module) -> Iterator[nn.Module]:
    """Record the ``training`` flag of ``model`` and of every submodule; restore each flag exactly on exit.

    Unlike ``model.train()``, submodules that were in eval mode (frozen BatchNorm, a frozen backbone) stay in eval
    mode, whatever happened inside the block (also when it raised).
    """
    modes = [(module, module.training) for module in model.modules()]
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training


@contextmanager
def attack_guard(model: nn.Module) -> Iterator[nn.Module]:
    """Run an attack on ``model`` without side effects on its training state.

    Inside the block: gradients are enabled and every parameter is frozen (``requires_grad=False``), so an attack
    can only differentiate with respect to its inputs. On exit, even after an exception: each submodule's mode and
    each parameter's ``requires_grad`` are restored, ``p.grad`` is the same object it was before (``None`` stays
    ``None``), and the per-sample-gradient attributes that hooks such as Opacus' attach (``grad_sample``,
    ``grad_sample_stack``) are as before: restored if they existed, removed if they did not.
    """
    params = list(model.parameters())
    saved = [(p, p.requires_grad, p.grad, {n: getattr(p, n) for n in _SAMPLE_ATTRS if hasattr(p, n)}) for p in params]
    try:
        with preserve_modes(model), torch.enable_grad():
            for p in params:
                p.requires_grad_(False)
            yield model
    finally:
        for p, requires_grad, grad, samples in saved:
            p.requires_grad_(requires_grad)
            p.grad = grad
            for name in _SAMPLE_ATTRS:
                if name in samples:
                    setattr(p, name, samples[name])
                elif hasattr(p, name):
                    delattr(p, name)


# ------------------------------------------------------------------------------------------- robust accuracy
def robust_accuracy(
    model: nn.Module,
    data: Iterable[Sequence[Tensor]] | tuple[Tensor, Tensor],
    attacks: Mapping[str, Attack] | Sequence[str],
    eps: float | None = None,
    device: str | torch.device = "cpu",
    max_examples: int | None = None,
    batch_size: int = 256,
    seed: int = 0,
) -> dict[str, float]:
    """Clean accuracy and accuracy under each attack (Madry et al. 2018, https://arxiv.org/abs/1706.06083).

    Each attack is run on every example, independently of the others (no worst case over attacks). Accuracy is
    counted with :class:`~lightning_dprobust.metrics.RobustAccuracy`. Each attack draws from its own stream, seeded by
    :func:`~lightning_dprobust.robustness.randomness.attack_seed` from ``seed`` and its name, in an isolated RNG: its
    result depends neither on the other attacks requested nor on the global RNG, which it leaves untouched.

    Args:
        model: maps ``[0, 1]`` images to logits; it is moved to ``device`` and evaluated in eval mode, and its
            modes, ``requires_grad`` flags and ``.grad`` are as before when the function returns.
        data: a loader yielding ``(images, labels, ...)`` batches, or a pair of tensors ``(images, labels)``.
        attacks: built attacks by display name, or suite names for :func:`build_attack` (then ``eps`` is needed).
        eps: budget of attacks given by name.
        device: where to run.
        max_examples: stop after this many examples.
        batch_size: chunk size when ``data`` is a pair of tensors.
        seed: seed from which each attack's stream is derived.

    Returns:
        ``{"clean": ..., name: ...}`` accuracies in ``[0, 1]`` (``nan`` without examples).
    """
    device = torch.device(device)
    model.to(device)
    suite = _resolve_attacks(model, attacks, eps)
    metrics = {name: RobustAccuracy().to(device) for name in ("clean", *suite)}
    streams = {name: AttackRandomness(attack_seed(seed, name)) for name in suite}
    for attack in suite.values():
        attack.set_device(device)
    with attack_guard(model):
        model.eval()
        for images, labels in _batches(data, batch_size, max_examples):
            images, labels = images.to(device), labels.to(device)
            with torch.no_grad():
                metrics["clean"].update(model(images), labels)
            for name, attack in suite.items():
                adversarial = streams[name].run(attack, images, labels)
                with torch.no_grad():
                    metrics[name].update(model(adversarial), labels)
    return {name: metric.compute().item() for name, metric in metrics.items()}


def _resolve_attacks(
    model: nn.Module, attacks: Mapping[str, Attack] | Sequence[str], eps: float | None
) -> dict[str, Attack]:
    if isinstance(attacks, Mapping):
        suite = dict(attacks)
    else:
        if eps is None:
            raise ValueError("robust_accuracy(attacks=[names]) needs eps (pixel units) to build the attacks")
        suite = {name: build_attack(name, model, eps) for name in attacks}
    if "clean" in suite:
        raise ValueError("'clean' is reserved for the clean accuracy: name the attack differently")
    return suite


def _batches(
    data: Iterable[Sequence[Tensor]] | tuple[Tensor, Tensor], batch_size: int, max_examples: int | None
) -> Iterator[tuple[Tensor, Tensor]]:
    if isinstance(data, tuple) and len(data) == 2 and all(isinstance(t, Tensor) for t in data):
        images, labels = data
        data = zip(images.split(batch_size), labels.split(batch_size), strict=True)
    remaining = math.inf if max_examples is None else max_examples
    for batch in data:
        if remaining <= 0:
            return
        images, labels = batch[0], batch[1]
        take = int(min(remaining, images.shape[0]))
        remaining -= take
        yield images[:take], labels[:take]


def format_table(results: Mapping[str, float]) -> str:
    """A markdown table of ``{attack: accuracy}`` (accuracies in ``[0, 1]``, shown as percentages)."""
    return markdown_table(["attack", "accuracy (%)"], [[name, f"{100 * value:.2f}"] for name, value in results.items()])


# ------------------------------------------------------------------------------------------------- SmoothAdv
def smoothed_cross_entropy(model: Callable[[Tensor], Tensor], x: Tensor, y: Tensor, noise: Tensor) -> Tensor:
    """``-log( mean_m softmax(model(x + noise[:, m]))[y] )``: cross-entropy of the soft smoothed classifier.

    Shape:
        x: ``[B, *S]``; y: ``[B]``; noise: ``[B, m, *S]``. Returns ``[B]``; entry ``i`` uses only ``x[i]``,
        ``y[i]`` and ``noise[i]`` (for a model without cross-example layers).
    """
    batch, draws = noise.shape[:2]
    logits = model((x.unsqueeze(1) + noise).flatten(0, 1)).view(batch, draws, -1)
    log_mean = torch.logsumexp(F.log_softmax(logits, dim=-1), dim=1) - math.log(draws)
    return -log_mean.gather(1, y.view(-1, 1)).squeeze(1)


class SmoothAdv(Attack):
    """L2 PGD on the soft smoothed classifier (Salman et al. 2019, https://arxiv.org/abs/1906.04584, Eq. 4 / S-PGD).

    Finds ``x'`` with ``||x' - x||_2 <= eps`` and ``x'`` in ``[0, 1]`` that **maximizes**
    ``J(x') = -log( (1/m) sum_j softmax(f(x' + eta_j))_y )``, ``eta_j ~ N(0, sigma^2 I)`` in pixel space: ``steps``
    normalized-gradient ascent steps of size ``alpha`` from ``x' = x``, each followed by clamping to ``[0, 1]`` and
    projection onto the L2 ball (a zero gradient is replaced by a random direction). DP-CERT's reference code
    minimizes ``J`` by mistake; this class ascends, as the paper states.

    Guarantees: the output lies in the ``eps`` ball around the input and in ``[0, 1]``; example ``i``'s output
    depends only on example ``i``, its label and its own noise draws; noise comes from this attack's generator,
    so a run is reproducible. ``last_noise`` holds the draws of the last step (shape ``[B, m, *S]``), so training
    can use the same draws on ``x'`` as Salman et al.'s multi-noise training does.

    Args:
        model: maps ``[0, 1]`` images to logits.
        eps: L2 radius in pixel units.
        sigma: standard deviation of the Gaussian noise.
        steps: number of ascent steps (``>= 1``).
        num_noise: ``m``, noise draws per example.
        alpha: step size; default ``2 eps / steps`` (Salman et al.'s code).
        fixed_noise: draw the noise once and reuse it at every step (Salman et al.'s training setting); ``False``
            draws fresh noise at every step.
        seed: seed of the noise generator, unless ``generator`` is given.
        generator: explicit generator (its device is where the noise is drawn).

    Shape:
        images ``[B, *S]`` in ``[0, 1]``, labels ``[B]``; returns ``[B, *S]``.
    """

    def __init__(
        self,
        model: nn.Module,
        eps: float = 0.25,
        sigma: float = 0.25,
        steps: int = 2,
        num_noise: int = 1,
        alpha: float | None = None,
        fixed_noise: bool = True,
        seed: int = 0,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__("SmoothAdv", model)
        if not (eps >= 0 and sigma >= 0 and steps >= 1 and num_noise >= 1):
            raise ValueError(
                f"SmoothAdv needs eps >= 0, sigma >= 0, steps >= 1 and num_noise >= 1, got eps={eps}, sigma={sigma}, "
                f"steps={steps}, num_noise={num_noise}"
            )
        self.eps = float(eps)
        self.sigma = float(sigma)
        self.steps = int(steps)
        self.num_noise = int(num_noise)
        self.alpha = 2.0 * self.eps / self.steps if alpha is None else float(alpha)
        self.fixed_noise = fixed_noise
        self.generator = generator if generator is not None else torch.Generator().manual_seed(seed)
        self.last_noise: Tensor | None = None
        self.supported_mode = ["default"]

    def forward(self, images: Tensor, labels: Tensor) -> Tensor:
        """The adversarial images; sets ``last_noise``."""
        x = images.clone().detach().to(self.device)
        y = labels.clone().detach().to(self.device)
        delta = torch.zeros_like(x)
        noise = None
        for _ in range(self.steps):
            if noise is None or not self.fixed_noise:
                noise = self._standard_normal((x.shape[0], self.num_noise, *x.shape[1:]), x) * self.sigma
            delta.requires_grad_(True)
            loss = smoothed_cross_entropy(self.get_logits, x + delta, y, noise).sum()
            (gradient,) = torch.autograd.grad(loss, delta)
            delta = self._ascend(x, delta.detach(), gradient)
        self.last_noise = noise
        return (x + delta).clamp(0.0, 1.0).detach()

    def _ascend(self, x: Tensor, delta: Tensor, gradient: Tensor) -> Tensor:
        view = (-1,) + (1,) * (x.dim() - 1)
        norms = gradient.flatten(1).norm(dim=1)
        if bool((norms == 0).any()):
            random = self._standard_normal(gradient.shape, gradient)
            gradient = torch.where((norms == 0).view(view), random, gradient)
            norms = gradient.flatten(1).norm(dim=1)
        delta = delta + self.alpha * gradient / norms.view(view)
        delta = (x + delta).clamp(0.0, 1.0) - x
        return delta * (self.eps / delta.flatten(1).norm(dim=1).clamp_min(1e-12)).clamp(max=1.0).view(view)

    def _standard_normal(self, shape: Sequence[int], like: Tensor) -> Tensor:
        draw = torch.randn(tuple(shape), generator=self.generator, device=self.generator.device, dtype=like.dtype)
        return draw.to(like.device)


__all__ = [
    "ATTACKS",
    "L2_ATTACKS",
    "SmoothAdv",
    "attack_guard",
    "build_attack",
    "format_table",
    "preserve_modes",
    "robust_accuracy",
    "smoothed_cross_entropy",
]
