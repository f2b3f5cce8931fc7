"""Per-example gradient norms and clipped sums of ``nn.Conv2d`` layers, three ways chosen from the layer's shapes.

A convolution is a linear map ``W`` applied at ``T`` output positions to unfolded input patches (``d`` values each)
giving ``p`` output channels (``core/ghost_layers.py``: ghost norm costs ``~T^2 (d + p)`` multiply-adds per example
plus unfolding ``T d`` input values, materializing ``G^T A`` costs ``~T d p``). The rule picks, per forward (Bu, Mao,
Xu 2022, "mixed ghost clipping", arXiv 2205.10683; Bu, Wang, Zha, Karypis, ICML 2023, book-keeping, arXiv
2210.00038):

* **ghost**: when ``UNFOLD_COST d + T (d + p) < d p`` (:data:`UNFOLD_COST`);
* **materialized, kept**: otherwise, when the per-example gradients (``B (d p + p)`` values) are no larger than the
  captured inputs and output gradients. They are formed (below) during the backward where the backward runs the
  layer's output node (the captures are dropped at once, :meth:`LayerRule.stream`), and the clipped sum is
  ``sum_i c_i grad_i``: no second weight-gradient convolution;
* **materialized, dropped**: otherwise; the per-example gradients give the norms and are freed, and the clipped sum
  is the convolution's own weight gradient of the scaled output gradients (as in the ghost case).

On CPU, per-example gradients are formed by a dilated forward convolution (the output gradients as kernels, the
stride as dilation) when the layer has at most :data:`FEW_INPUT_CHANNELS` input channels, else by a grouped
weight-gradient convolution, a chunk of examples at a time (:data:`CPU_CHUNK_VALUES`), which also bounds the memory
of the dropped route's per-example gradients by one chunk. Off CPU, by one batched product of the output gradients
and the unfolded inputs (:func:`unfold_patches`): cuDNN ran the grouped convolution group by group, and PyTorch's
CUDA ``F.unfold`` runs once per example (:func:`uses_batched_products`).

Requirements (:meth:`Conv2dRule.supports`): ``groups == 1`` and zero padding given as numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from lightning_dprobust.core.ghost_layers import Capture, LinearRule, group_rows, squared_norms

CPU_CHUNK_VALUES = 2**18
"""On CPU, per-example gradients are formed in equal chunks of examples that hold at most this many values (one
example at least): the grouped convolution slows down more than in proportion to its groups once its output leaves
the cache (ResNet-18's first stage at batch 64: 14.1 ms in one piece, 7.3 ms in chunks of 8 examples)."""

UNFOLD_COST = 40
"""The cost of unfolding one input value (``im2col``, a memory-bound copy) in multiply-adds, for the choice between
ghost norm and materialization. Measured on CPU (one thread): ``cnn_tanh``'s second layer at batch 64 unfolds at
about 2 ns a value and multiplies at 0.05 ns; with it that layer is materialized (by the grouped convolution, no
unfold). In three in-process A/Bs of 7 rounds, that made the DP step 4 to 18 % faster at batch 1024, 0 to 11 % at
batch 256, and left it within noise at batch 64 (-1 to +2 %)."""

FEW_INPUT_CHANNELS = 3
"""Convolutions with at most this many input channels (image inputs) form their per-example gradients by the dilated
forward convolution, faster there than the grouped weight-gradient convolution and slower with more channels
(CPU, one thread: ``cnn_tanh``'s first layer at batch 256 4.7 vs 6.2 ms; ResNet-18's first stage 32 vs 14 ms)."""


def uses_batched_products(tensor: Tensor) -> bool:
    """Whether per-example gradients and unfolded inputs are formed by batched products and strided copies
    (off CPU) rather than grouped convolutions and ``F.unfold`` (CPU). On an H100, ResNet-18's DP step at batch 64 by
    the CPU route launched 2,910 kernels (non-private: 327) and kept the GPU busy half its 46.6 ms: ``F.unfold`` ran
    one ``im2col`` kernel per example (31 % of the GPU time) and cuDNN's grouped weight-gradient convolution one
    set of kernels per group."""
    return tensor.device.type != "cpu"


def unfold_patches(inputs: Tensor, conv: nn.Conv2d, strided: bool | None = None) -> Tensor:
    """``F.unfold`` of ``inputs`` by ``conv``'s kernel, dilation, zero padding and stride: ``[N, C kh kw, L]``.

    ``strided`` (default: :func:`uses_batched_products`) forms it as one padded copy and one copy of a strided
    view, whatever the batch size; the values and their order are ``F.unfold``'s exactly.
    """
    if not (uses_batched_products(inputs) if strided is None else strided):
        return torch.nn.functional.unfold(inputs, conv.kernel_size, conv.dilation, conv.padding, conv.stride)
    (ph, pw), (kh, kw), (dh, dw), (sh, sw) = conv.padding, conv.kernel_size, conv.dilation, conv.stride
    x = torch.nn.functional.pad(inputs, (pw, pw, ph, ph))
    n, c, h, w = x.shape
    oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
    sn, sc, s_h, s_w = x.stride()
    view = x.as_strided((n, c, kh, kw, oh, ow), (sn, sc, dh * s_h, dw * s_w, sh * s_h, sw * s_w), x.storage_offset())
    return view.reshape(n, c * kh * kw, oh * ow)


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
        return UNFOLD_COST * d + positions * (d + p) >= d * p

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
        """Per-example ``weight`` / ``bias`` gradients of one call, formed chunk by chunk (:data:`CPU_CHUNK_VALUES`)."""
        parts = list(self._chunked([(inputs, grad)], examples))
        return parts[0] if len(parts) == 1 else {k: torch.cat([part[k] for part in parts]) for k in parts[0]}

    def _chunked(self, calls: list[tuple[Tensor, Tensor]], examples: int) -> Iterator[dict[str, Tensor]]:
        """Per-example gradients summed over ``calls`` (input, output gradient), one chunk of examples at a time."""
        per_example = sum(p.numel() for p in self.tensors().values())
        rows = [group_rows(inputs, examples).shape[1] for inputs, _ in calls]  # refuses 0 examples
        largest = examples if uses_batched_products(calls[0][0]) else max(1, CPU_CHUNK_VALUES // per_example)
        size = math.ceil(examples / math.ceil(examples / largest))  # chunks of equal size
        for start in range(0, examples, size):
            count, total = min(size, examples - start), {}
            for (inputs, grad), k in zip(calls, rows, strict=True):
                part = slice(start * k, (start + count) * k)
                grads = self._example_gradients(inputs[part], grad[part], count)
                total = {name: total[name] + g if name in total else g for name, g in grads.items()}
            yield total

    def _example_gradients(self, inputs: Tensor, grad: Tensor, examples: int) -> dict[str, Tensor]:
        """Per-example gradients of ``examples`` examples: off CPU one batched product; on CPU the dilated forward
        convolution for few input channels, else a grouped weight-gradient convolution with the examples as groups
        (an example's ``k`` rows are the batch dim of that convolution)."""
        conv, out = self.module, {}
        if "weight" in self.names and uses_batched_products(inputs):
            out["weight"] = self._product_weight_gradients(inputs, grad, examples)
        elif "weight" in self.names and conv.in_channels <= FEW_INPUT_CHANNELS:
            out["weight"] = self._dilated_weight_gradients(inputs, grad, examples)
        elif "weight" in self.names:
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

    def _product_weight_gradients(self, inputs: Tensor, grad: Tensor, examples: int) -> Tensor:
        """Per-example weight gradients ``[B, p, C, kh, kw]`` as one batched product ``G_i A_i^T`` of each example's
        output gradients ``[p, k L]`` and unfolded inputs ``[d, k L]`` (its ``k`` rows' positions side by side)."""
        conv = self.module
        cols = group_rows(unfold_patches(inputs, conv, strided=True), examples)  # [B, k, d, L]
        g = group_rows(grad.flatten(2), examples)  # [B, k, p, L]
        cols, g = cols.transpose(1, 2).flatten(2), g.transpose(1, 2).flatten(2)
        return torch.bmm(g, cols.transpose(1, 2)).view(examples, *conv.weight.shape)

    def _dilated_weight_gradients(self, inputs: Tensor, grad: Tensor, examples: int) -> Tensor:
        """Per-example weight gradients ``[B, p, C, kh, kw]`` as one forward convolution of the padded inputs (channels
        as the batch dim) by the output gradients (examples as groups, an example's rows as input channels: their
        sum is the example's gradient), with the layer's stride as dilation and its dilation as stride; the
        result is cropped to the kernel size."""
        conv = self.module
        (ph, pw), (kh, kw) = conv.padding, conv.kernel_size
        x = group_rows(torch.nn.functional.pad(inputs, (pw, pw, ph, ph)), examples)  # [B, k, C, H, W]
        g = group_rows(grad, examples).transpose(1, 2)  # [B, p, k, oh, ow]
        kernels = g.reshape(examples * conv.out_channels, g.shape[2], *g.shape[3:])
        images = x.permute(2, 0, 1, 3, 4).flatten(1, 2)  # [C, B k, H, W]
        out = torch.nn.functional.conv2d(images, kernels, None, conv.dilation, 0, conv.stride, examples)
        out = out[:, :, :kh, :kw].view(conv.in_channels, examples, conv.out_channels, kh, kw)
        return out.permute(1, 2, 0, 3, 4)

    def sq_norms(self, examples: int) -> Tensor:
        if self.keeps_per_example(examples):
            return self._per_example_sq_norms(examples)
        if self._materializes(examples):  # each chunk's per-example gradients are freed after its norms
            chunks = self._chunked([(call.inputs, call.grad) for call in self.calls], examples)
            total = torch.cat([sum(squared_norms(g) for g in grads.values()) for grads in chunks])
        else:
            total = super().sq_norms(examples)  # ghost norm on the unfolded input
        self._cache = None  # the clipped sum needs neither the per-example gradients nor the unfolded input
        return total

    def _rows(self, call: Capture) -> tuple[Tensor, Tensor]:
        return unfold_patches(call.inputs, self.module).transpose(1, 2), call.grad.flatten(2).transpose(1, 2)

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
