"""Per-example gradient norms and clipped sums of ``nn.Conv2d`` layers, three ways chosen from the layer's shapes.

A convolution is a linear map ``W`` applied at ``T`` output positions to unfolded input patches (``d`` values each)
giving ``p`` output channels (``core/ghost_layers.py``: ghost norm costs ``~T^2 (d + p)`` per example, materializing
``G^T A`` costs ``~T d p``). The rule picks, per forward (Bu, Mao, Xu 2022, "mixed ghost clipping", arXiv 2205.10683;
Bu, Wang, Zha, Karypis, ICML 2023, book-keeping, arXiv 2210.00038):

* **ghost**: when ``T (d + p) < d p``;
* **materialized, kept**: otherwise, when the per-example gradients (``B (d p + p)`` values) are no larger than the
  captured inputs and output gradients. They are formed by one grouped weight-gradient convolution (examples as
  groups), during the backward where the backward runs the layer's output node (the captures are dropped at once,
  :meth:`LayerRule.stream`), and the clipped sum is ``sum_i c_i grad_i``: no second weight-gradient convolution;
* **materialized, dropped**: otherwise; the per-example gradients give the norms and are freed, and the clipped sum
  is the convolution's own weight gradient of the scaled output gradients (as in the ghost case).

Requirements (:meth:`Conv2dRule.supports`): ``groups == 1`` and zero padding given as numbers.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lightning_dprobust.core.ghost_layers import Capture, LinearRule, group_rows


class Conv2dRule(LinearRule):
    """``nn.Conv2d``: ghost norm, or materialized per-example gradients kept or dropped (module docstring)."""

    _keeps: bool | None = None

    @staticmethod
    def supports(conv: nn.Conv2d) -> bool:
        return conv.groups == 1 and conv.padding_mode == "zeros" and not isinstance(conv.padding, str)

    def reset(self) -> None:
        super().reset()
        self._keeps: bool | None = None

    # ------------------------------------------------------------------------------------ choice of route
    def _materializes(self, examples: int) -> bool:
        conv = self.module
        if "weight" not in self.names:
            return True  # bias only: its per-example gradient is a sum of output gradients
        d, p = conv.weight[0].numel(), conv.out_channels
        positions = sum(math.prod(call.shape[2:]) * (call.shape[0] // max(examples, 1)) for call in self.calls)
        return positions * (d + p) >= d * p

    def keeps_per_example(self, examples: int) -> bool:
        """Whether this forward's per-example gradients are materialized and kept (decided once per forward, while
        every call still holds its input)."""
        if self._keeps is None:
            self._keeps = self._materializes(examples) and self.per_example_fits_captures(examples)
        return self._keeps

    def prefers_streaming(self, examples: int) -> bool:
        return self.keeps_per_example(examples)

    # ------------------------------------------------------------------------------------ norms and sums
    def call_gradients(self, inputs: Tensor, grad: Tensor, examples: int) -> dict[str, Tensor]:
        """Per-example ``weight`` / ``bias`` gradients of one call: a grouped weight-gradient convolution with the
        examples as groups (``k`` rows per example are the batch dim of that convolution)."""
        conv, out = self.module, {}
        if "weight" in self.names:
            x = group_rows(inputs, examples).transpose(0, 1).flatten(1, 2)  # [k, B C, H, W]
            g = group_rows(grad, examples).transpose(0, 1).flatten(1, 2)
            # only the weight's shape is read; a broadcast view avoids copying the weight B times
            weight = conv.weight.detach().new_empty(1).expand(examples * conv.out_channels, *conv.weight.shape[1:])
            out["weight"] = self._weight_grad(g, x, weight, examples, (True, False))[0].view(
                examples, *conv.weight.shape
            )
        if "bias" in self.names:
            out["bias"] = group_rows(grad, examples).sum(dim=(1, 3, 4))
        return out

    def sq_norms(self, examples: int) -> Tensor:
        if self.keeps_per_example(examples):
            return self._per_example_sq_norms(examples)
        if self._materializes(examples):
            total = self._per_example_sq_norms(examples)
        else:
            total = super().sq_norms(examples)  # ghost norm on the unfolded input
        self._cache = None  # the clipped sum needs neither the per-example gradients nor the unfolded input
        return total

    def _rows(self, call: Capture) -> tuple[Tensor, Tensor]:
        conv = self.module
        cols = torch.nn.functional.unfold(call.inputs, conv.kernel_size, conv.dilation, conv.padding, conv.stride)
        return cols.transpose(1, 2), call.grad.flatten(2).transpose(1, 2)

    def clipped_sum(self, factors: Tensor) -> dict[str, Tensor]:
        if self.keeps_per_example(factors.shape[0]):
            return self._per_example_clipped_sum(factors)
        del self._cache
        conv, out = self.module, {}
        mask = ("weight" in self.names, "bias" in self.names)
        for call in self.calls:
            rows = factors.to(call.grad.dtype).repeat_interleave(call.grad.shape[0] // factors.shape[0])
            scaled = call.grad * rows[:, None, None, None]
            weight, bias = self._weight_grad(scaled, call.inputs, conv.weight.detach(), 1, mask)
            for local, grad in (("weight", weight), ("bias", bias)):
                if local in self.names:
                    name = self.names[local]
                    out[name] = out[name].add_(grad) if name in out else grad
        return out

    def _weight_grad(
        self, grad: Tensor, inputs: Tensor, weight: Tensor, groups: int, mask: tuple[bool, bool]
    ) -> tuple[Tensor | None, Tensor | None]:
        """``(weight, bias)`` gradients of the convolution (``mask`` says which) summed over the batch dim."""
        conv = self.module
        _, w, b = torch.ops.aten.convolution_backward(
            grad,
            inputs,
            weight,
            [weight.shape[0]],
            conv.stride,
            conv.padding,
            conv.dilation,
            False,
            [0, 0],
            groups,
            [False, *mask],
        )
        return w, b
