"""Residual perturbation: Gaussian noise in every residual block of any residual network, at train and test time.

Tao, Ling, Shi, Wang, "Deep Learning with Data Privacy via Residual Perturbation" (ICLR 2021 submission,
OpenReview eNSpdJeR_J; arXiv 2408.05723), equations (6) and (8), with the ensembles of Wang, Shi, Osher 2019
("ResNets Ensemble via the Feynman-Kac Formalism", https://arxiv.org/abs/1811.10745):

* Strategy I (``"additive"``): ``x^{i+1} = x^i + F(x^i) + gamma n^i`` and input noise ``x^0 = x + pi n``;
* Strategy II (``"multiplicative"``): ``x^{i+1} = x^i + F(x^i) + gamma max(|x_s^i|, eta) n^i`` where ``x_s^i`` is
  the block input after the shortcut projection (``eta = 0`` is the paper's eq. 8; ``eta > 0`` its Theorem 2 class).

The network is not copied or edited: forward hooks on its residual blocks add the noise to their outputs, so its
``state_dict`` is unchanged and the same weights load with or without noise. Supported blocks: our
:class:`~lightning_dprobust.models.resnet8.PreActBlock` and timm's ResNet ``BasicBlock``/``Bottleneck`` (timm adds
the noise after the block's final ReLU, since its blocks are post-activation).

Randomness: every draw comes from a generator the wrapper owns, keyed with 128 bits of the operating system's entropy
(``secrets``) unless an explicit ``seed`` is given (a warned test mode), independent of the global torch RNG and of
``seed_everything``; the generator is never saved in a checkpoint. Keyed, not seeded: on CPU its whole state follows
from the key (:func:`~lightning_dprobust.core.sampling.keyed_generator`), where a ``manual_seed`` would keep 32 bits.
"""

from __future__ import annotations

import secrets
import warnings
from collections.abc import Sequence
from typing import Any, Literal

import torch
from timm.models.resnet import BasicBlock, Bottleneck
from torch import Tensor, nn

from lightning_dprobust.core.sampling import keyed_generator
from lightning_dprobust.models.registry import create_model, register_model
from lightning_dprobust.models.resnet8 import PreActBlock

Strategy = Literal["additive", "multiplicative"]
NoiseScale = Literal["absolute", "tensor_std"]
STRATEGIES = ("additive", "multiplicative")
NOISE_SCALES = ("absolute", "tensor_std")


def _skip_module(block: nn.Module) -> nn.Module | None:
    """The module whose output is the block's ``x_s`` (``None``: ``x_s`` is the block input itself)."""
    if isinstance(block, PreActBlock):
        return block.skip_path if block.skip else None
    return block.downsample


def residual_blocks(model: nn.Module) -> list[nn.Module]:
    """The residual blocks of ``model`` in forward order (``PreActBlock``, timm ``BasicBlock``/``Bottleneck``)."""
    return [module for module in model.modules() if isinstance(module, (PreActBlock, BasicBlock, Bottleneck))]


def _check(strategy: str, gamma: float, input_noise: float, eta: float, noise_scale: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES} (Strategy I, II), got {strategy!r}")
    if noise_scale not in NOISE_SCALES:
        raise ValueError(f"noise_scale must be one of {NOISE_SCALES}, got {noise_scale!r}")
    for name, value in (("gamma", gamma), ("input_noise", input_noise), ("eta", eta)):
        if not (isinstance(value, (int, float)) and 0 <= value < float("inf")):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


class PerturbedResidualNet(nn.Module):
    """``model`` with residual perturbation: noise after every residual block (and on the input), train and eval.

    Args:
        model: a network with residual blocks (e.g. ``create_model("preact_resnet8", ...)`` or ``timm/resnet18``);
            it is wrapped, not copied.
        strategy: ``"additive"`` (Strategy I) or ``"multiplicative"`` (Strategy II).
        gamma: the noise coefficient of every block (a std, in the units of the block output).
        input_noise: ``pi``, std of the noise added to the input images (pixel units); the paper uses
            ``gamma / 2`` for Strategy I and none for Strategy II.
        eta: Strategy II's floor on ``|x_s|`` (0: the paper's experiments).
        noise_scale: ``"absolute"`` (the paper) or ``"tensor_std"`` (EnResNet: ``gamma * std(out)``).
        noise_at_eval: keep the noise in eval mode (the paper's inference); ``False`` for analysis only.
        seed: fix the noise (test mode, warned); ``None`` seeds from the operating system's entropy.

    Attributes:
        draws: number of noise tensors drawn so far (one per block and one for the input per forward).

    Raises:
        ValueError: for an unknown strategy or scale, a negative or non-finite coefficient, or a model without
            residual blocks.
    """

    def __init__(
        self,
        model: nn.Module,
        strategy: Strategy = "additive",
        gamma: float = 0.0,
        input_noise: float = 0.0,
        eta: float = 0.0,
        noise_scale: NoiseScale = "absolute",
        noise_at_eval: bool = True,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        _check(strategy, gamma, input_noise, eta, noise_scale)
        blocks = residual_blocks(model)
        if not blocks:
            raise ValueError(
                f"{type(getattr(model, 'net', model)).__name__} has no residual block to perturb: use a residual "
                "network such as "
                "preact_resnet8 or timm/resnet18"
            )
        if getattr(model, "_residual_noise_hooked", False):
            raise ValueError(f"{type(model).__name__} is already perturbed: wrap a fresh network (noise would stack)")
        model._residual_noise_hooked = True
        self.model = model
        self.strategy, self.gamma, self.input_noise, self.eta = strategy, float(gamma), float(input_noise), float(eta)
        self.noise_scale, self.noise_at_eval = noise_scale, noise_at_eval
        if seed is not None:
            warnings.warn(f"residual noise seeded with {seed}: reproducible noise is a test mode", stacklevel=2)
        self._seed = secrets.randbits(128) if seed is None else int(seed)
        self._generators: dict[torch.device, torch.Generator] = {}
        self._skip_inputs: dict[int, Tensor] = {}
        self.draws = 0
        for index, block in enumerate(blocks):
            block.register_forward_hook(self._perturb_block)
            skip = _skip_module(block)
            if skip is not None:
                skip.register_forward_hook(lambda _m, _i, out, index=index: self._skip_inputs.__setitem__(index, out))
        self._block_index = {id(block): index for index, block in enumerate(blocks)}

    @property
    def active(self) -> bool:
        """Whether a forward pass draws noise now (training, or evaluation with ``noise_at_eval``)."""
        return self.training or self.noise_at_eval

    def _noise(self, like: Tensor) -> Tensor:
        generator = self._generators.get(like.device)
        if generator is None:
            generator = keyed_generator(like.device, self._seed, len(self._generators))
            self._generators[like.device] = generator
        self.draws += 1
        return torch.randn(like.shape, generator=generator, device=like.device, dtype=like.dtype)

    def _perturb_block(self, block: nn.Module, inputs: tuple[Tensor, ...], out: Tensor) -> Tensor | None:
        index = self._block_index[id(block)]
        skip_input = self._skip_inputs.pop(index, inputs[0])
        if not self.active or self.gamma == 0:
            return None
        scale = self.gamma * (out.std() if self.noise_scale == "tensor_std" else 1.0)
        if self.strategy == "multiplicative":
            scale = scale * skip_input.abs().clamp_min(self.eta)
        return out + scale * self._noise(out)

    def forward(self, x: Tensor) -> Tensor:
        """Logits of ``x`` with input noise ``pi n`` and block noise (when :attr:`active`)."""
        if self.active and self.input_noise > 0:
            x = x + self.input_noise * self._noise(x)
        return self.model(x)

    def extra_repr(self) -> str:
        """Show the noise settings (never the seed)."""
        return (
            f"strategy={self.strategy}, gamma={self.gamma}, input_noise={self.input_noise}, eta={self.eta}, "
            f"noise_scale={self.noise_scale}, noise_at_eval={self.noise_at_eval}"
        )


class Ensemble(nn.Module):
    """``En_K``: the mean of ``K`` members' logits (or, with ``combine="probabilities"``, the log of their mean
    softmax), each member with its own initialization and its own noise.

    Args:
        members: the ``K >= 1`` networks.
        combine: ``"logits"`` (EnResNet; trained jointly on the averaged logits) or ``"probabilities"``.
    """

    def __init__(self, members: list[nn.Module], combine: Literal["logits", "probabilities"] = "logits") -> None:
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member (ensemble_size >= 1)")
        if combine not in ("logits", "probabilities"):
            raise ValueError(f"combine must be 'logits' or 'probabilities', got {combine!r}")
        self.members = nn.ModuleList(members)
        self.combine = combine

    def forward(self, x: Tensor) -> Tensor:
        """The combined logits (log-probabilities for ``combine="probabilities"``)."""
        outputs = torch.stack([member(x) for member in self.members])
        if self.combine == "logits":
            return outputs.mean(dim=0)
        return torch.logsumexp(torch.log_softmax(outputs, dim=-1), dim=0) - torch.log(torch.tensor(len(outputs)))


@register_model("residual_perturbation")
def residual_perturbation(
    *,
    num_classes: int,
    input_shape: tuple[int, int, int],
    base: str = "preact_resnet8",
    base_kwargs: dict[str, Any] | None = None,
    member_mean: Sequence[float] | None = None,
    member_std: Sequence[float] | None = None,
    ensemble_size: int = 1,
    combine: Literal["logits", "probabilities"] = "logits",
    seed: int | None = None,
    **noise: Any,
) -> Ensemble:
    """``En_K`` of registry network ``base``: ``ensemble_size`` members, each built by :func:`create_model` (its own
    initialization, behind its normalization ``member_mean``/``member_std``) and wrapped in
    :class:`PerturbedResidualNet` with the ``noise`` settings (``strategy``, ``gamma``, ``input_noise``, ``eta``,
    ``noise_scale``, ``noise_at_eval``); member ``k`` gets ``seed + k`` when a seed is given.
    """
    if not (isinstance(ensemble_size, int) and ensemble_size >= 1):
        raise ValueError(f"ensemble_size must be an int >= 1, got {ensemble_size!r}: set e.g. ensemble_size: 5")
    members = []
    for k in range(ensemble_size):
        net = create_model(
            base,
            num_classes=num_classes,
            input_shape=input_shape,
            mean=member_mean,
            std=member_std,
            **(base_kwargs or {}),
        )
        members.append(PerturbedResidualNet(net, seed=None if seed is None else seed + k, **noise))
    return Ensemble(members, combine)
