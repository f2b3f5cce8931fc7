"""Per-example gradient norms and clipped sums of ``nn.Conv2d`` layers, three ways chosen from the layer's shapes.

A convolution is a linear map ``W`` applied at ``T`` output positions to unfolded input patches (``d`` values each)
giving ``p`` output channels (``core/ghost/layers.py``: ghost norm costs ``~T^2 (d + p)`` multiply-adds per example,
materializing ``G^T A`` costs ``~T d p``; both unfold the patches). The rule picks, per forward (Bu, Mao, Xu 2022,
"mixed ghost clipping", arXiv 2205.10683; Bu, Wang, Zha, Karypis, ICML 2023, book-keeping, arXiv 2210.00038):

* **ghost**: when ``T (d + p) < d p``; the clipped sum is computed as in the dropped route below, except on CPU
  where the unfolded patches take at most :data:`CPU_HELD_PATCHES` times the memory of the layer's captures: they
  are kept from the norm to the clipped sum (the captured inputs are dropped), and the sum is one matrix product of
  the scaled output gradients and those patches;
* **materialized, kept**: otherwise, when the per-example gradients (``B (d p + p)`` values) are no larger than the
  captured inputs and output gradients. They are formed (below) during the backward where the backward runs the
  layer's output node (the captures are dropped at once, :meth:`LayerRule.stream`), and the clipped sum is
  ``sum_i c_i grad_i``: no second weight-gradient convolution;
* **materialized, dropped**: otherwise; the per-example gradients give the norms and are freed, and the clipped sum
  is the convolution's own weight gradient of the scaled output gradients, or on CPU, for
  maps of at most :data:`CPU_PRODUCT_SUM_POSITIONS` output positions, one matrix product of the scaled output
  gradients and the unfolded inputs.

Patches are unfolded by a strided copy from a channels-last view of the input (:func:`unfold_patches`: the copy
moves runs of ``kw C`` values; on CPU, where those runs are short, by two copies with longer runs,
:data:`CPU_TWO_COPY_RUN`), and per-example gradients are one batched product of each example's output gradients
and patches. On CPU a cache-sized chunk of examples is formed at a time (:data:`CPU_CHUNK_VALUES`), which also bounds
the memory of the dropped route's per-example gradients by one chunk.

Grouped convolutions (``groups > 1``: depthwise ones in MobileNet, EfficientNet, ConvNeXt) are ``groups``
convolutions side by side, each from its ``C / groups`` input channels to its ``p / groups`` output channels. Each
group's weight has few values (``p / groups`` by ``kh kw C / groups``: 9 per depthwise output channel for a 3x3
kernel), so their per-example gradients are always materialized (kept, or dropped where they outgrow the captures;
the ghost route is for ``groups == 1``): one batched product over (example, group) pairs of each group's output
gradients and patches. Depthwise layers (one input channel per group) need no patches: each row's gradient is the
correlation of its input channels with their output gradients, one depthwise convolution with a group per (row,
channel) pair (:meth:`Conv2dRule._depthwise_correlation`), which also gives the dropped route's clipped sum; on maps
of a single output position, where oneDNN is slow at that, a broadcast product of patches and output gradients.
MobileNetV3-Small, EfficientNet-B0 and ConvNeXt-Atto at 32x32, batch 64, one thread, whole steps in one process: the
broadcast product alone was 0.93x [0.91-1.02] and 0.84x [0.79-0.91] of the batched product's time on the first
two; the depthwise convolution 0.90x [0.60-1.00] and 0.73x [0.64-1.12] of the broadcast product's on MobileNetV3
and ConvNeXt. The CPU product sums are one product per group.

``nn.Conv1d`` layers are convolutions over maps of height 1 (:class:`Conv1dRule`), by the same routes.

Requirements (:meth:`Conv2dRule.supports`): zero padding given as numbers, and the layer's own class's forward
(``layers.runs_forward_of``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import cached_property

import torch
from torch import Tensor, nn

from lightning_dprobust.core.ghost.layers import (
    Capture,
    LinearRule,
    UnsupportedCall,
    group_rows,
    memory_order,
    squared_norms,
)
from lightning_dprobust.core.ghost.registry import register_rule
from lightning_dprobust.core.per_sample import tf32_settings

CPU_CHUNK_VALUES = 2**18
"""On CPU, per-example gradients are formed in equal chunks of examples whose per-example gradients and unfolded
patches hold at most this many values (one example at least). That bounds the memory of the patches (``cnn_tanh``'s
first layer at batch 64: 0.8 MB held at a time against 3.2 MB), and past the cache the batched product slows down
more than in proportion to its examples (one thread, ResNet-18's stem at batch 256: 41.0 ms in one piece against
27.0 ms in chunks of 5 examples; ``cnn_tanh``'s first layer at batch 1024: 64 ms against 33 ms). A smaller bound
costs more calls (ResNet-18's first stage at batch 64: 6.2 ms in one piece, 7.3 ms in chunks of 3 examples, 10.7 ms
one example at a time)."""

CPU_PRODUCT_SUM_POSITIONS = 4
"""On CPU, the clipped sum of a layer with at most this many output positions per row is one matrix product of the
scaled output gradients and the unfolded inputs, not oneDNN's weight-gradient convolution, which is slow on tiny
maps (one thread, batch 64, 3x3 kernels: 1x1 maps with 512 channels 20.9 against 6.6 ms, 2x2 maps with 256 channels
7.4 against 5.1 ms, 3x3 maps 9.2 against 15.7 ms; the non-private backward pays the convolution's cost too)."""


CPU_TWO_COPY_RUN = 16
"""On CPU, patches whose rows hold fewer consecutive input values than this (``kw C``, channels-last) are unfolded by
two copies with longer runs (:func:`unfold_patches`) when the dilation along the height is 1: a copy is slow per run on
CPU when runs are this short. One thread, batch 64, in isolation (one copy against two): ``cnn_tanh``'s first layer (1
channel, 8x8 kernel, stride 2; runs of 8) 1.22 against 0.66 ms, 3 channels with a 3x3 kernel (runs of 9) 4.08 against
1.78 ms, 3 channels with a 5x5 kernel (runs of 15) 4.33 against 3.83 ms. From runs of 16 on, one copy was about as fast
or faster: 0.53 against 0.65 ms for 4 channels with a 4x4 kernel, and 1.22 against 1.68 ms for ResNet-18's stem (runs of
21)."""


CPU_HELD_PATCHES = 2
"""On CPU, a ghost-norm layer keeps the patches its norm unfolded, for its clipped sum, when they hold at most this
many times the values of its captured inputs and output gradients (``cnn_tanh``'s second layer: 1.8; ResNet-18's
last stage at 32x32: 1.5 to 1.8; a 3x3 convolution of stride 1: about 4.5, not kept). The clipped sum is then one
matrix product with them instead of oneDNN's weight-gradient convolution (``cnn_tanh``'s second layer, batch 64, one
thread, in isolation: 0.35 against 0.61 ms); the patches replace the captured inputs until that sum."""


def _sums_by_product(call: Capture) -> bool:
    """Whether a call's clipped sum is one matrix product (:data:`CPU_PRODUCT_SUM_POSITIONS`)."""
    return call.grad.device.type == "cpu" and math.prod(call.grad.shape[2:]) <= CPU_PRODUCT_SUM_POSITIONS


def unfold_patches(inputs: Tensor, conv: nn.Conv2d) -> Tensor:
    """The input patches ``conv`` multiplies, as rows ``[N, L, d]`` (``L`` output positions), each row ordered
    ``(kh, kw, C)``: ``F.unfold``'s patches with the channel dim last.

    A copy of the input in channels-last memory order (none where it is stored so already, as ``cnn_tanh``'s second
    layer's is; converted before padding, which is 2 to 6 times faster on small maps), a padded copy, then one copy of
    a strided view, which moves runs of ``kw C`` values when the dilation is 1 (from channels-first storage the runs
    would be ``kw`` values long). On ResNet-18 at batch 64 (one thread, one process alternating the two) the
    convolution rules took 125 ms a step against 163 ms with the grouped weight-gradient convolution and ``F.unfold``
    that channels-first inputs with more than 3 channels took on CPU before. On CPU, where those runs are shorter than
    :data:`CPU_TWO_COPY_RUN` and the dilation along the height is 1, two copies replace the last one: every input row
    unfolded along the width (``[N, W', H, kw, C]``, about ``kh / sh`` times fewer values than the patches), from
    which each patch's ``kh`` rows are one run of ``kh kw C`` values.
    """
    (ph, pw), (kh, kw), (dh, dw), (sh, sw) = conv.padding, conv.kernel_size, conv.dilation, conv.stride
    x = torch.nn.functional.pad(inputs.contiguous(memory_format=torch.channels_last), (pw, pw, ph, ph))
    # padding keeps the channels-last order, except for 1x1 maps (stored both ways): there this call copies
    x = x.contiguous(memory_format=torch.channels_last)
    n, c, h, w = x.shape
    oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
    sn, sc, s_h, s_w = x.stride()
    if x.device.type == "cpu" and dh == 1 and kw * c < CPU_TWO_COPY_RUN:
        # [n, ow, h, kw, c]: every input row unfolded along the width; then a patch's kh rows are one run
        rows = x.as_strided((n, ow, h, kw, c), (sn, sw * s_w, s_h, dw * s_w, sc), x.storage_offset()).contiguous()
        rn, r_ow, r_h = rows.stride()[:3]
        view = rows.as_strided((n, oh, ow, kh, kw * c), (rn, sh * r_h, r_ow, r_h, 1))
    else:
        strides = (sn, sh * s_h, sw * s_w, dh * s_h, dw * s_w, sc)
        view = x.as_strided((n, oh, ow, kh, kw, c), strides, x.storage_offset())
    return view.reshape(n, oh * ow, kh * kw * c)


def _convolution_precision():
    """CUDA matrix products inside the block with cuDNN's TF32 setting, not their own (restored after). The batched
    product below forms convolution weight gradients, which non-private training gets from cuDNN, with TF32 by
    default; a matrix product's own default is off. Where the per-example gradients are kept, their norms and their
    shares of the clipped sum are both taken from them, so TF32 cannot make a share exceed its clip. The dropped route
    computes only norms, which a different product's share must match: it runs inside
    :func:`~lightning_dprobust.core.per_sample.float32_products`, where both settings are off, so it stays float32.
    So does the first step's check against the vmap engine. CPU products have no TF32: nothing changes there."""
    cudnn = torch.backends.cudnn.allow_tf32
    return tf32_settings(cudnn=cudnn, matmul=cudnn)


def _channels_first(columns: Tensor, conv: nn.Conv2d) -> Tensor:
    """``[..., kh kw C]`` columns (patches, or products with them) as ``[..., C, kh, kw]`` (a permuted view); ``C`` is
    the input channels of one group."""
    shaped = columns.view(*columns.shape[:-1], *conv.kernel_size, conv.weight.shape[1])
    k = columns.dim() - 1
    return shaped.permute(*range(k), k + 2, k, k + 1)


def _cat_examples(parts: list[Tensor]) -> Tensor:
    """``torch.cat`` along the examples in the parts' memory order: the batched products' permuted views are joined as
    they lie, not copied into the default order."""
    order, inverse = memory_order(parts[0])
    return torch.cat([part.permute(order) for part in parts]).permute(inverse)


@register_rule(nn.Conv2d)
class Conv2dRule(LinearRule):
    """``nn.Conv2d``: ghost norm, or materialized per-example gradients kept or dropped (module docstring)."""

    _keeps: bool | None = None

    @property
    def conv(self) -> nn.Conv2d:
        """The layer's geometry and weight as a ``nn.Conv2d``'s (:class:`Conv1dRule`: its ``nn.Conv1d`` read so)."""
        return self.module

    @staticmethod
    def supports(conv: nn.Conv2d) -> bool:
        return conv.padding_mode == "zeros" and not isinstance(conv.padding, str)

    def reset(self) -> None:
        super().reset()
        self._keeps: bool | None = None

    def capture(self, tensor: Tensor, output: tuple[object, torch.Size]) -> None:
        if tensor.dim() != 4:
            raise UnsupportedCall(
                f"a convolution saw a {tensor.dim()}-D input: the ghost engine needs batched [N, C, H, W] inputs; "
                "use DPCallback(engine='vmap') for convolutions called on single images"
            )
        super().capture(tensor, output)

    # ------------------------------------------------------------------------------------ choice of route
    def _materializes(self, examples: int) -> bool:
        conv = self.conv
        if "weight" not in self.names or conv.groups > 1:
            return True  # bias only (a sum of output gradients), or a grouped weight (the module docstring)
        d, p = math.prod(conv.weight.shape[1:]), conv.out_channels
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
        """Per-example ``weight`` / ``bias`` gradients of one call, formed chunk by chunk (:data:`CPU_CHUNK_VALUES`)."""
        parts = list(self._chunked([(inputs, grad)], examples))
        return parts[0] if len(parts) == 1 else {k: _cat_examples([part[k] for part in parts]) for k in parts[0]}

    def _chunked(self, calls: list[tuple[Tensor, Tensor]], examples: int) -> Iterator[dict[str, Tensor]]:
        """Per-example gradients summed over ``calls`` (input, output gradient), one chunk of examples at a time."""
        rows = [group_rows(inputs, examples).shape[1] for inputs, _ in calls]  # refuses 0 examples
        per_example = sum(p.numel() for p in self.tensors().values())
        unfolds = any(not self._by_depthwise_convolution(grad) for _, grad in calls)
        if "weight" in self.names and unfolds:  # and the example's unfolded patches (every group's)
            positions = sum(k * math.prod(grad.shape[2:]) for (_, grad), k in zip(calls, rows, strict=True))
            per_example += positions * math.prod(self.conv.weight.shape[1:]) * self.conv.groups
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
        """Per-example gradients of ``examples`` examples: the weight's as one batched product ``G_i A_i`` of each
        example's output gradients ``[p, k L]`` and unfolded patches ``[k L, d]`` (its ``k`` rows' positions one after
        the other), a permuted view ``[B, p, C, kh, kw]`` of the product (the patches are ordered ``(kh, kw, C)``).
        A grouped layer's product is over (example, group) pairs (:meth:`_grouped_product`)."""
        out = {}
        if "weight" in self.names and self._by_depthwise_convolution(grad):
            with _convolution_precision():
                out["weight"] = group_rows(self._depthwise_correlation(inputs, grad), examples).sum(dim=1)
        elif "weight" in self.names:
            a = group_rows(unfold_patches(inputs, self.conv), examples).flatten(1, 2)  # [B, k L, d]
            g = group_rows(grad.flatten(2), examples).transpose(1, 2).flatten(2)  # [B, p, k L]
            with _convolution_precision():
                product = torch.bmm(g, a) if self.conv.groups == 1 else self._grouped_product(g, a)
                out["weight"] = _channels_first(product, self.conv)
        if "bias" in self.names:
            out["bias"] = group_rows(grad, examples).sum(dim=(1, 3, 4))
        return out

    def _by_depthwise_convolution(self, grad: Tensor) -> bool:
        """Whether a depthwise layer's per-example gradients are one depthwise convolution (maps of more than one
        output position: on a single one, oneDNN took 70 to 250 ms where the broadcast product takes 4 to 8)."""
        return self.conv.weight.shape[1] == 1 and self.conv.groups > 1 and math.prod(grad.shape[2:]) > 1

    def _depthwise_correlation(self, inputs: Tensor, grad: Tensor) -> Tensor:
        """``[N, p, 1, kh, kw]``: a depthwise layer's weight gradient of each row, as one depthwise convolution of the
        padded inputs by the output gradients (the layer's stride as the dilation, its dilation as the stride; each
        (row, channel) pair a group): channel ``c`` of a row correlated with its output gradients of channels
        ``c m .. c m + m - 1``; no patches. (Summing the rows inside the convolution instead, each channel a group of
        all rows, was 2 to 7 times slower in oneDNN; batch 64, one thread.)"""
        conv, (rows, channels) = self.conv, inputs.shape[:2]
        (ph, pw), (kh, kw) = conv.padding, conv.kernel_size
        padded = torch.nn.functional.pad(inputs, (pw, pw, ph, ph))
        correlated = torch.nn.functional.conv2d(
            padded.reshape(1, rows * channels, *padded.shape[2:]),
            grad.reshape(rows * conv.out_channels, 1, *grad.shape[2:]),
            stride=conv.dilation,
            dilation=conv.stride,
            groups=rows * channels,
        )
        return correlated[..., :kh, :kw].reshape(rows, *conv.weight.shape)

    def _grouped_product(self, g: Tensor, a: Tensor) -> Tensor:
        """``[B, p, kh kw C_g]``: each group's output gradients ``[p / groups, k L]`` times its patches ``[k L, kh kw
        C_g]`` (the patches' channels split into ``groups`` runs of ``C_g``), for every example and group at once;
        depthwise (``C_g = 1``, maps of one position) by a broadcast product summed over the positions (module
        docstring)."""
        groups, (b, positions, _) = self.conv.groups, a.shape
        taps, per_group = math.prod(self.conv.kernel_size), self.conv.weight.shape[1]
        if per_group == 1:  # depthwise: a broadcast product summed over the positions, no copy of the patches
            multiplier = g.shape[1] // groups
            g = g.view(b, groups, multiplier, positions).permute(0, 3, 1, 2).unsqueeze(2)  # [B, L, 1, groups, m]
            product = (a.view(b, positions, taps, groups, 1) * g).sum(dim=1)  # [B, taps, groups, m]
            return product.permute(0, 2, 3, 1).reshape(b, groups * multiplier, taps)
        a = a.view(b, positions, taps, groups, per_group).permute(0, 3, 1, 2, 4).reshape(b * groups, positions, -1)
        product = torch.bmm(g.reshape(b * groups, -1, positions), a)  # [B groups, p / groups, kh kw C_g]
        return product.view(b, g.shape[1], -1)

    def sq_norms(self, examples: int) -> Tensor:
        if self._materializes(examples):  # each chunk's per-example gradients are freed after its norms
            chunks = self._chunked([(call.inputs, call.grad) for call in self.calls], examples)
            return torch.cat([sum(squared_norms(g) for g in grads.values()) for grads in chunks])
        total = super().sq_norms(examples)  # ghost norm on the unfolded patches, cached with the output gradients
        if self._holds_patches():
            for call in self.calls:
                call.inputs = None  # the clipped sum reads the patches
        else:
            self._cache = None  # the clipped sum reads the captured inputs
        return total

    def _holds_patches(self) -> bool:
        """Whether the cached patches are kept for the clipped sum (:data:`CPU_HELD_PATCHES`)."""
        patches = self._cache[0]
        captures = sum(call.inputs.numel() + call.shape.numel() for call in self.calls)
        return patches.device.type == "cpu" and patches.numel() <= CPU_HELD_PATCHES * captures

    def _rows(self, call: Capture) -> tuple[Tensor, Tensor]:
        return unfold_patches(call.inputs, self.conv), call.grad.flatten(2).transpose(1, 2)

    def clipped_sum(self, factors: Tensor) -> dict[str, Tensor]:
        if self._cache is not None:
            return super().clipped_sum(factors)  # one product with the held patches
        out = {}
        mask = ("weight" in self.names, "bias" in self.names)
        for call in self.calls:
            # each example's rows (its views) scaled by its factor: a broadcast, one kernel whatever the view count
            scaled = (group_rows(call.grad, factors.shape[0]) * factors.to(call.grad.dtype).view(-1, 1, 1, 1, 1)).view(
                call.grad.shape
            )
            if mask[0] and self._by_depthwise_convolution(call.grad):
                weight = self._depthwise_correlation(call.inputs, scaled).sum(dim=0)
                bias = scaled.sum(dim=(0, 2, 3)) if mask[1] else None
            elif _sums_by_product(call):
                weight, bias = self._product_sum(scaled, call.inputs, mask)
            else:
                weight, bias = self._weight_grad(scaled, call.inputs, mask)
            for local, grad in (("weight", weight), ("bias", bias)):
                if local in self.names:
                    name = self.names[local]
                    out[name] = out[name].add_(grad) if name in out else grad
        return out

    def _weight_product(self, rows: Tensor, patches: Tensor) -> Tensor:
        """``G^T A`` as the weight ``[p, C, kh, kw]``, from output-gradient rows ``[M, p]`` and patches ``[M, d]``.
        Whichever is smaller, the patches or the product ``[p, d]``, is copied into the weight's ``(C, kh, kw)`` order
        (ResNet-18's last stage, 1x1 maps, batch 64: 64 rows of patches against a 512-row product whose copy took
        longer than the product)."""
        conv = self.conv
        if rows.shape[0] < conv.out_channels:
            return (rows.T @ _channels_first(patches, conv).reshape(patches.shape)).view(conv.weight.shape)
        return _channels_first(rows.T @ patches, conv).contiguous()

    def _product_sum(
        self, grad: Tensor, inputs: Tensor, mask: tuple[bool, bool]
    ) -> tuple[Tensor | None, Tensor | None]:
        """``(weight, bias)`` gradients (``mask`` says which) summed over the batch dim, the weight's as one matrix
        product of the output gradients and the unfolded inputs of every row and position (one per group)."""
        conv, weight = self.conv, None
        if mask[0] and conv.groups > 1:  # every row's positions as the positions of one example
            patches = unfold_patches(inputs, conv).flatten(0, 1).unsqueeze(0)  # [1, N L, d]
            rows = grad.flatten(2).transpose(0, 1).reshape(1, conv.out_channels, -1)  # [1, p, N L]
            weight = _channels_first(self._grouped_product(rows, patches), conv).reshape(conv.weight.shape)
        elif mask[0]:
            rows = grad.flatten(2).transpose(1, 2).reshape(-1, conv.out_channels)  # [N L, p]
            weight = self._weight_product(rows, unfold_patches(inputs, conv).reshape(rows.shape[0], -1))
        return weight, grad.sum(dim=(0, 2, 3)) if mask[1] else None

    def _weight_grad(
        self, grad: Tensor, inputs: Tensor, mask: tuple[bool, bool]
    ) -> tuple[Tensor | None, Tensor | None]:
        """``(weight, bias)`` gradients of the convolution (``mask`` says which) summed over the batch dim."""
        conv = self.conv
        _, w, b = torch.ops.aten.convolution_backward(
            grad,
            inputs,
            conv.weight.detach(),
            [conv.out_channels],
            conv.stride,
            conv.padding,
            conv.dilation,
            False,
            [0, 0],
            conv.groups,
            [False, *mask],
        )
        return w, b


class _HeightOneConv:
    """A ``nn.Conv1d`` read as a ``nn.Conv2d`` over maps of height 1: what :class:`Conv2dRule` reads of its layer,
    with a leading 1 in the kernel, stride and dilation, 0 in the padding, and the weight as a ``[p, C, 1, k]`` view."""

    def __init__(self, conv1d: nn.Conv1d) -> None:
        self.conv1d, self.groups, self.out_channels = conv1d, conv1d.groups, conv1d.out_channels
        self.kernel_size, self.stride = (1, *conv1d.kernel_size), (1, *conv1d.stride)
        self.dilation, self.padding = (1, *conv1d.dilation), (0, *conv1d.padding)

    @property
    def weight(self) -> Tensor:
        return self.conv1d.weight.unsqueeze(2)


@register_rule(nn.Conv1d)
class Conv1dRule(Conv2dRule):
    """``nn.Conv1d`` (sequence models; ECA channel attention, Wang et al. 2020, arXiv 1910.03151, in timm's
    ``eca_*`` models): a ``nn.Conv2d`` over maps of height 1, by the same three routes (module docstring). Its inputs
    ``[N, C, L]`` are captured as ``[N, C, 1, L]`` views and its output gradients read as ``[N, p, 1, L']``; its
    per-example gradients and clipped sums are returned in its weight's own ``[p, C, k]`` shape."""

    @cached_property
    def conv(self) -> _HeightOneConv:
        return _HeightOneConv(self.module)

    def capture(self, tensor: Tensor, output: tuple[object, torch.Size]) -> None:
        if tensor.dim() != 3:
            raise UnsupportedCall(
                f"a Conv1d saw a {tensor.dim()}-D input: the ghost engine needs batched [N, C, L] inputs; use "
                "DPCallback(engine='vmap') for convolutions called on single sequences"
            )
        edge, (rows, channels, length) = output
        super().capture(tensor.unsqueeze(2), (edge, torch.Size((rows, channels, 1, length))))

    def call_gradients(self, inputs: Tensor, grad: Tensor, examples: int) -> dict[str, Tensor]:
        out = super().call_gradients(inputs, grad, examples)
        if "weight" in out:
            out["weight"] = out["weight"].squeeze(3)  # [B, p, C, 1, k] -> [B, p, C, k]
        return out

    def clipped_sum(self, factors: Tensor) -> dict[str, Tensor]:
        out = super().clipped_sum(factors)
        if "weight" in self.names:
            out[self.names["weight"]] = out[self.names["weight"]].squeeze(2)
        return out
