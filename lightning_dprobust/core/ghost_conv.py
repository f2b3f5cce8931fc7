"""Per-example gradient norms and clipped sums of ``nn.Conv2d`` layers, three ways chosen from the layer's shapes.

A convolution is a linear map ``W`` applied at ``T`` output positions to unfolded input patches (``d`` values each)
giving ``p`` output channels (``core/ghost_layers.py``: ghost norm costs ``~T^2 (d + p)`` multiply-adds per example
plus unfolding ``T d`` input values, materializing ``G^T A`` costs ``~T d p``). The rule picks, per forward (Bu, Mao,
Xu 2022, "mixed ghost clipping", arXiv 2205.10683; Bu, Wang, Zha, Karypis, ICML 2023, book-keeping, arXiv
2210.00038):

* **ghost**: when ``T (d + p) < d p``, with ``UNFOLD_COST d`` added on the left where the materialized route would
  be the grouped convolution, which unfolds nothing (:data:`UNFOLD_COST`);
* **materialized, kept**: otherwise, when the per-example gradients (``B (d p + p)`` values) are no larger than the
  captured inputs and output gradients. They are formed (below) during the backward where the backward runs the
  layer's output node (the captures are dropped at once, :meth:`LayerRule.stream`), and the clipped sum is
  ``sum_i c_i grad_i``: no second weight-gradient convolution;
* **materialized, dropped**: otherwise; the per-example gradients give the norms and are freed, and the clipped sum
  is the convolution's own weight gradient of the scaled output gradients (as in the ghost case), or on CPU, for
  maps of at most :data:`CPU_PRODUCT_SUM_POSITIONS` output positions, one matrix product of the scaled output
  gradients and the unfolded inputs.

Per-example gradients are formed from the layer's unfolded input patches (:func:`unfold_patches`, one strided copy
in the input's memory order) by one batched product with the output gradients, except on CPU for inputs stored
channels-first with more than :data:`FEW_INPUT_CHANNELS` channels, where a grouped weight-gradient convolution (the
examples as groups) is faster: there the copy would move runs of only ``kw`` values (:func:`uses_batched_products`).
On CPU a cache-sized chunk of examples is formed at a time (:data:`CPU_CHUNK_VALUES`), which also bounds the memory of
the dropped route's per-example gradients by one chunk.

Requirements (:meth:`Conv2dRule.supports`): ``groups == 1`` and zero padding given as numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from lightning_dprobust.core.ghost_layers import Capture, LinearRule, group_rows, memory_order, squared_norms

CPU_CHUNK_VALUES = 2**18
"""On CPU, per-example gradients are formed in equal chunks of examples whose per-example gradients and unfolded
patches hold at most this many values (one example at least): past the cache, the grouped convolution slows down
more than in proportion to its groups (ResNet-18's first stage at batch 64: 14.1 ms in one piece, 7.3 ms in chunks of
8 examples), and the batched product too (``cnn_tanh``'s first layer at batch 1024: 64 ms in one piece, 33 ms in
chunks)."""

UNFOLD_COST = 40
"""The cost of unfolding one input value in multiply-adds, counted against the ghost norm where the materialized route
unfolds nothing (the grouped convolution). Measured on CPU (one thread) with ``F.unfold``: about 2 ns a value
against 0.05 ns a multiply-add."""

FEW_INPUT_CHANNELS = 3
"""On CPU, channels-first inputs with at most this many channels (images) get their per-example gradients from the
batched product, those with more from the grouped convolution (one thread, batch 64: ``cnn_tanh``'s first layer 1.9
ms, ResNet-18's stem 11.5 ms, against 2.5 and 14.0 ms by the dilated convolution this route replaced; ResNet-18's
first stage, 64 channels: 21.4 ms against 12.2 ms by the grouped convolution)."""


CPU_PRODUCT_SUM_POSITIONS = 4
"""On CPU, the clipped sum of a layer with at most this many output positions per row is one matrix product of the
scaled output gradients and the unfolded inputs, not oneDNN's weight-gradient convolution, which is slow on tiny
maps (one thread, batch 64, 3x3 kernels: 1x1 maps with 512 channels 20.9 against 6.6 ms, 2x2 maps with 256 channels
7.4 against 5.1 ms, 3x3 maps 9.2 against 15.7 ms; the non-private backward pays the convolution's cost too)."""


def _channels_last(inputs: Tensor) -> bool:
    return inputs.dim() == 4 and inputs.shape[1] > 1 and inputs.stride(1) < inputs.stride(3)


def uses_batched_products(inputs: Tensor) -> bool:
    """Whether a convolution's per-example gradients come from its unfolded patches and one batched product (off CPU;
    on CPU for channels-last inputs and inputs with at most :data:`FEW_INPUT_CHANNELS` channels) rather than a grouped
    weight-gradient convolution. Channels-last patches are copied in runs of ``kw C`` values (``cnn_tanh``'s second
    layer at batch 64, one thread: 0.7 ms against 3.1 ms by the grouped convolution). On an H100, ResNet-18's DP step
    at batch 64 with the grouped convolution and ``F.unfold`` launched 2,910 kernels (non-private: 327): ``F.unfold``
    ran one ``im2col`` kernel per example and cuDNN the grouped convolution group by group."""
    few_channels = inputs.dim() == 4 and inputs.shape[1] <= FEW_INPUT_CHANNELS
    return inputs.device.type != "cpu" or few_channels or _channels_last(inputs)


def _sums_by_product(call: Capture) -> bool:
    """Whether a call's clipped sum is one matrix product (:data:`CPU_PRODUCT_SUM_POSITIONS`)."""
    return call.grad.device.type == "cpu" and math.prod(call.grad.shape[2:]) <= CPU_PRODUCT_SUM_POSITIONS


def unfold_patches(inputs: Tensor, conv: nn.Conv2d) -> tuple[Tensor, bool]:
    """The input patches ``conv`` multiplies, as rows ``[N, L, d]`` (``L`` output positions), and whether each row is
    ordered ``(kh, kw, C)`` rather than ``F.unfold``'s ``(C, kh, kw)``.

    Where the batched products run (:func:`uses_batched_products`), one padded copy and one copy of a strided view in
    the input's memory order: channels-last inputs give rows ``(kh, kw, C)`` (the copy moves runs of ``kw C`` values
    when the dilation is 1), others ``F.unfold``'s rows. Elsewhere (CPU, channels-first inputs with many channels,
    whose strided copy moves runs of a few values: ResNet-18's ghost-norm layers at 32x32, batch 64, 31.5 ms against
    23.8 ms) ``F.unfold`` itself.
    """
    if not uses_batched_products(inputs):
        return torch.nn.functional.unfold(inputs, conv.kernel_size, conv.dilation, conv.padding, conv.stride).mT, False
    (ph, pw), (kh, kw), (dh, dw), (sh, sw) = conv.padding, conv.kernel_size, conv.dilation, conv.stride
    channels_last = _channels_last(inputs)
    x = torch.nn.functional.pad(inputs, (pw, pw, ph, ph))
    n, c, h, w = x.shape
    oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
    sn, sc, s_h, s_w = x.stride()
    offset = x.storage_offset()
    if channels_last:
        view = x.as_strided((n, oh, ow, kh, kw, c), (sn, sh * s_h, sw * s_w, dh * s_h, dw * s_w, sc), offset)
        return view.reshape(n, oh * ow, kh * kw * c), True
    view = x.as_strided((n, c, kh, kw, oh, ow), (sn, sc, dh * s_h, dw * s_w, sh * s_h, sw * s_w), offset)
    return view.reshape(n, c * kh * kw, oh * ow).mT, False


def _cat_examples(parts: list[Tensor]) -> Tensor:
    """``torch.cat`` along the examples in the parts' memory order: permuted views (the batched products of
    channels-last inputs) are joined as they lie, not copied into the default order."""
    order, inverse = memory_order(parts[0])
    return torch.cat([part.permute(order) for part in parts]).permute(inverse)


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
        unfold = 0 if uses_batched_products(self.calls[0].inputs) else UNFOLD_COST * d  # both routes unfold, or ghost
        return unfold + positions * (d + p) >= d * p

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
        return parts[0] if len(parts) == 1 else {k: _cat_examples([part[k] for part in parts]) for k in parts[0]}

    def _chunked(self, calls: list[tuple[Tensor, Tensor]], examples: int) -> Iterator[dict[str, Tensor]]:
        """Per-example gradients summed over ``calls`` (input, output gradient), one chunk of examples at a time."""
        rows = [group_rows(inputs, examples).shape[1] for inputs, _ in calls]  # refuses 0 examples
        per_example = sum(p.numel() for p in self.tensors().values())
        if "weight" in self.names and uses_batched_products(calls[0][0]):  # and the example's unfolded patches
            positions = sum(k * math.prod(grad.shape[2:]) for (_, grad), k in zip(calls, rows, strict=True))
            per_example += positions * self.module.weight[0].numel()
        largest = max(1, CPU_CHUNK_VALUES // per_example) if calls[0][0].device.type == "cpu" else examples
        size = math.ceil(examples / math.ceil(examples / largest))  # chunks of equal size
        for start in range(0, examples, size):
            count, total = min(size, examples - start), {}
            for (inputs, grad), k in zip(calls, rows, strict=True):
                part = slice(start * k, (start + count) * k)
                grads = self._example_gradients(inputs[part], grad[part], count)
                total = {name: total[name] + g if name in total else g for name, g in grads.items()}
            yield total

    def _example_gradients(self, inputs: Tensor, grad: Tensor, examples: int) -> dict[str, Tensor]:
        """Per-example gradients of ``examples`` examples: the batched product (:func:`uses_batched_products`), else a
        grouped weight-gradient convolution with the examples as groups (an example's ``k`` rows are the batch dim of
        that convolution)."""
        conv, out = self.module, {}
        if "weight" in self.names and uses_batched_products(inputs):
            out["weight"] = self._product_weight_gradients(inputs, grad, examples)
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
        """Per-example weight gradients ``[B, p, C, kh, kw]`` as one batched product ``G_i A_i`` of each example's
        output gradients ``[p, k L]`` and unfolded patches ``[k L, d]`` (its ``k`` rows' positions one after the
        other); for channels-last inputs a permuted view of the product (its rows are ordered ``(kh, kw, C)``)."""
        conv = self.module
        patches, channels_last = unfold_patches(inputs, conv)
        a = group_rows(patches, examples).flatten(1, 2)  # [B, k L, d]
        g = group_rows(grad.flatten(2), examples).transpose(1, 2).flatten(2)  # [B, p, k L]
        product = torch.bmm(g, a)
        if channels_last:
            return product.view(examples, conv.out_channels, *conv.kernel_size, conv.in_channels).permute(0, 1, 4, 2, 3)
        return product.view(examples, *conv.weight.shape)

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
        return unfold_patches(call.inputs, self.module)[0], call.grad.flatten(2).transpose(1, 2)

    def clipped_sum(self, factors: Tensor) -> dict[str, Tensor]:
        if self.keeps_per_example(factors.shape[0]):
            return self._per_example_clipped_sum(factors)
        del self._cache
        conv, out = self.module, {}
        mask = ("weight" in self.names, "bias" in self.names)
        for call in self.calls:
            rows = factors.to(call.grad.dtype).repeat_interleave(call.grad.shape[0] // factors.shape[0])
            scaled = call.grad * rows[:, None, None, None]
            if _sums_by_product(call):
                weight, bias = self._product_sum(scaled, call.inputs, mask)
            else:
                weight, bias = self._weight_grad(scaled, call.inputs, conv.weight.detach(), 1, mask)
            for local, grad in (("weight", weight), ("bias", bias)):
                if local in self.names:
                    name = self.names[local]
                    out[name] = out[name].add_(grad) if name in out else grad
        return out

    def _product_sum(
        self, grad: Tensor, inputs: Tensor, mask: tuple[bool, bool]
    ) -> tuple[Tensor | None, Tensor | None]:
        """``(weight, bias)`` gradients (``mask`` says which) summed over the batch dim, the weight's as one matrix
        product ``G^T A`` of the output gradients and the unfolded inputs of every row and position."""
        conv, weight = self.module, None
        if mask[0]:
            patches, kernel_major = unfold_patches(inputs, conv)
            rows = grad.flatten(2).transpose(1, 2).reshape(-1, conv.out_channels)  # [N L, p]
            product = rows.T @ patches.reshape(rows.shape[0], -1)  # [p, d]
            if kernel_major:
                product = product.view(conv.out_channels, *conv.kernel_size, conv.in_channels).permute(0, 3, 1, 2)
            weight = product.reshape(conv.weight.shape)
        return weight, grad.sum(dim=(0, 2, 3)) if mask[1] else None

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
