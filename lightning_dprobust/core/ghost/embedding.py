"""Per-example gradient norms and clipped sums of ``nn.Embedding`` without per-example ``[vocabulary, dim]`` tables.

An embedding is a linear layer on one-hot inputs, so one example's gradient of the table is zero except on the rows of
the tokens it looked up: row ``v`` is the sum of the output gradients ``g_t`` at the example's positions ``t`` whose
token is ``v``. Its squared norm is ``sum_v ||sum_{t: id_t = v} g_t||^2``, the ghost norm ``sum_{t, t'} [id_t = id_t']
<g_t, g_t'>`` of Li et al. 2022 ("Large Language Models Can Be Strong Differentially Private Learners", arXiv
2110.05679) with the one-hot Gram matrix; the clipped sum adds each example's rows, scaled by its clip factor, into the
table (book-keeping, Bu et al. 2023, arXiv 2210.00038: no second backward).

:class:`EmbeddingRule` forms those rows directly: every position of every example is keyed ``example * vocabulary +
token``, one sort (``torch.unique``) groups equal keys and one ``index_add_`` sums their output gradients. Time and
memory are those of the output gradients (``N T dim`` values) whatever the vocabulary, where the generic rule
(:class:`~lightning_dprobust.core.ghost.layers.MaterializedRule`) formed ``B x vocabulary x dim`` values. No
cross-example term: two examples' keys differ even where their tokens are equal.

Covered: ``nn.Embedding`` without ``max_norm`` (which renormalizes looked-up rows of the table in place during the
forward) and without ``scale_grad_by_freq`` (which divides by token counts); those keep the generic rule. Positions
holding ``padding_idx`` get no gradient, as in ``F.embedding``. ``DPCallback`` refuses ``max_norm`` (a leak, not just
another formula) and ``sparse=True`` (:func:`~lightning_dprobust.models.dp_incompatibilities`). On a GPU,
``torch.unique`` waits for the device once per layer and step (its output size depends on the tokens).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_dprobust.core.ghost.layers import LayerRule, group_rows, squared_norms
from lightning_dprobust.core.ghost.registry import register_rule


@register_rule(nn.Embedding)
class EmbeddingRule(LayerRule):
    """``nn.Embedding`` on token ids ``[N, ...]``: per-(example, token) row sums, their norms and clipped sum."""

    _cache: tuple[Tensor, Tensor, Tensor] | None = None
    """``(row sums [K, dim], their tokens [K], their examples [K])``, from :meth:`sq_norms` to :meth:`clipped_sum`."""

    @staticmethod
    def supports(embedding: nn.Embedding) -> bool:
        return embedding.max_norm is None and not embedding.scale_grad_by_freq

    def _keyed_positions(self, examples: int) -> tuple[Tensor, Tensor]:
        """``example * vocabulary + token`` of every position ``[M]`` and its output gradient ``[M, dim]``, without
        the positions holding ``padding_idx``. An example's rows (its views) and its calls are its positions."""
        vocabulary, keys, grads = self.module.num_embeddings, [], []
        for call in self.calls:
            tokens = group_rows(call.inputs, examples).reshape(examples, -1).long()
            offsets = torch.arange(examples, device=tokens.device).unsqueeze(1) * vocabulary
            keys.append((tokens + offsets).flatten())
            grads.append(call.grad.reshape(-1, call.grad.shape[-1]))
        key, grad = (keys[0], grads[0]) if len(keys) == 1 else (torch.cat(keys), torch.cat(grads))
        if self.module.padding_idx is not None:
            keep = key % vocabulary != self.module.padding_idx
            key, grad = key[keep], grad[keep]
        return key, grad

    def sq_norms(self, examples: int) -> Tensor:
        key, grad = self._keyed_positions(examples)
        unique, slot = torch.unique(key, return_inverse=True)
        rows = grad.new_zeros(unique.shape[0], grad.shape[1]).index_add_(0, slot, grad)
        owners = torch.div(unique, self.module.num_embeddings, rounding_mode="floor")
        self._cache = (rows, unique - owners * self.module.num_embeddings, owners)
        for call in self.calls:
            call.inputs = call.grad = None  # the clipped sum reads the row sums only
        return rows.new_zeros(examples).index_add_(0, owners, squared_norms(rows))

    def clipped_sum(self, factors: Tensor) -> dict[str, Tensor]:
        rows, tokens, owners = self._cache
        del self._cache
        scaled = rows * factors.to(rows.dtype)[owners].unsqueeze(1)
        table = torch.zeros_like(self.module.weight, dtype=rows.dtype).index_add_(0, tokens, scaled)
        return {self.names["weight"]: table}
