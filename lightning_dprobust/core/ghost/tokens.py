"""Per-example gradients of vision transformers' token parameters: class, register and distillation tokens and
position embeddings, which timm adds to the patch embeddings outside any layer.

The tokens are concatenated in front of the patch embeddings and the position embedding is added (before or after
the concatenation); both are linear in the parameters, so each example's gradient is a slice of the gradient at the
result, summed over the example's rows. That tensor is what timm passes to ``pos_drop``: it is captured at
``pos_drop``'s input, and a call starts after ``patch_embed`` (the sequence marker of ``core/ghost/graph.py``).
Only timm's own token code is covered (its methods are checked by identity); subclasses that override it keep the
vmap engine.
"""

from __future__ import annotations

from collections.abc import Collection

from torch import Tensor, nn

from lightning_dprobust.core.ghost.layers import Capture, Hook, MaterializedRule, group_rows, output_edge
from lightning_dprobust.core.ghost.registry import register_rule

TOKEN_NAMES = {"cls_token", "reg_token", "dist_token", "pos_embed"}
"""The parameter names :class:`TokenRule` may cover."""


class _TokensAtPosDrop(MaterializedRule):
    """Captured at the input of ``pos_drop``; a call starts after each of ``patch_embeds``."""

    def patch_embeds(self) -> list[nn.Module]:
        return [self.module.patch_embed]

    def capture_hooks(self) -> list[Hook]:
        def capture(mod: nn.Module, args: tuple, kwargs: dict) -> None:
            self.capture(args[0], output_edge(args[0]))

        starts = [Hook(embed, False, self.start_call, first=False) for embed in self.patch_embeds()]
        return [*starts, Hook(self.module.pos_drop, True, capture)]


@register_rule()
class TokenRule(_TokensAtPosDrop):
    """timm ``VisionTransformer``'s ``cls_token``, ``reg_token`` and ``pos_embed`` (Dosovitskiy et al. 2021,
    arXiv 2010.11929), and DeiT's ``VisionTransformerDistilled`` with its ``dist_token`` (Touvron et al. 2021,
    arXiv 2012.12877)."""

    @classmethod
    def applies(cls, module: nn.Module, names: Collection[str]) -> bool:
        return set(names) <= TOKEN_NAMES and cls.supports(module)

    @staticmethod
    def supports(vit: nn.Module) -> bool:
        """timm's own ``_pos_embed`` of either class, with a position embedding and a fixed image size."""
        return (
            _prefix_order(vit) is not None
            and vit.pos_embed is not None
            and not getattr(vit, "dynamic_img_size", True)
            and isinstance(getattr(vit, "pos_drop", None), nn.Module)
            and isinstance(getattr(vit, "patch_embed", None), nn.Module)
        )

    def call_gradients(self, inputs: Tensor, grad: Tensor, examples: int) -> dict[str, Tensor]:
        g = group_rows(grad, examples).sum(dim=1)  # [B, tokens, D]
        vit, slices, start = self.module, {}, 0
        for name in _prefix_order(vit):
            token = getattr(vit, name, None)
            if token is not None:
                slices[name], start = g[:, start : start + token.shape[1]], start + token.shape[1]
        slices["pos_embed"] = g[:, start:] if vit.no_embed_class else g
        return {k: slices[k].unsqueeze(1) for k in self.names}


def _prefix_order(vit: nn.Module) -> tuple[str, ...] | None:
    """The tokens ``_pos_embed`` puts in front of the patch embeddings, in order, or ``None`` for another
    ``_pos_embed``."""
    from timm.models.deit import VisionTransformerDistilled
    from timm.models.vision_transformer import VisionTransformer

    own = getattr(type(vit), "_pos_embed", None)
    if own is VisionTransformer._pos_embed:
        return ("cls_token", "reg_token")
    if own is VisionTransformerDistilled._pos_embed:
        return ("cls_token", "dist_token")
    return None


@register_rule()
class CrossViTTokenRule(_TokensAtPosDrop):
    """timm ``CrossVit``'s ``cls_token_0``, ``cls_token_1``, ``pos_embed_0`` and ``pos_embed_1`` (Chen, Fan, Panda
    2021, "CrossViT", arXiv 2103.14899): two branches of patch sizes, each with its class token (concatenated first)
    and its position embedding (added after), passed through the one shared ``pos_drop``. A call's branch is the one
    whose position embedding has its token count, so CrossViTs whose branches have equal token counts are not
    covered."""

    NAMES = frozenset({"cls_token_0", "cls_token_1", "pos_embed_0", "pos_embed_1"})

    @classmethod
    def applies(cls, module: nn.Module, names: Collection[str]) -> bool:
        return set(names) <= cls.NAMES and cls.supports(module)

    @staticmethod
    def supports(model: nn.Module) -> bool:
        from timm.models.crossvit import CrossVit

        # timm 1.0.31 embeds in ``_embed``; earlier 1.0 releases (1.0.29) run that code inside ``forward_features``
        embedding = "_embed" if hasattr(CrossVit, "_embed") else "forward_features"
        return (
            getattr(type(model), embedding, None) is getattr(CrossVit, embedding)
            and len(model.patch_embed) == 2
            and model.pos_embed_0.shape[1] != model.pos_embed_1.shape[1]
            and isinstance(getattr(model, "pos_drop", None), nn.Module)
        )

    def patch_embeds(self) -> list[nn.Module]:
        return list(self.module.patch_embed)

    def call_gradients(self, inputs: Tensor, grad: Tensor, examples: int) -> dict[str, Tensor]:
        g = group_rows(grad, examples).sum(dim=1)  # [B, 1 + patches of the branch, D]
        branch = 0 if g.shape[1] == self.module.pos_embed_0.shape[1] else 1
        slices = {f"cls_token_{branch}": g[:, :1], f"pos_embed_{branch}": g}
        return {k: v.unsqueeze(1) for k, v in slices.items() if k in self.names}


@register_rule()
class CaiTTokenRule(MaterializedRule):
    """timm ``Cait``'s ``pos_embed`` and ``cls_token`` (Touvron et al. 2021, "Going deeper with image transformers",
    arXiv 2103.17239). The position embedding is added to the patch embeddings (captured at ``pos_drop``'s input,
    after ``patch_embed``); the class token joins only in the class-attention blocks, expanded per row and passed to
    the first of them as ``x_cls`` (captured there, after ``blocks``). Each example's gradient is the sum over its rows
    of the gradient at the captured tensor."""

    NAMES = frozenset({"cls_token", "pos_embed"})

    @classmethod
    def applies(cls, module: nn.Module, names: Collection[str]) -> bool:
        return set(names) <= cls.NAMES and cls.supports(module)

    @staticmethod
    def supports(model: nn.Module) -> bool:
        """timm's own ``forward_features``, with class-attention blocks, and its ``forward_cls`` where the release has
        one (timm 1.0.31 moved the class-attention loop out of ``forward_features`` into it; 1.0.29 has none)."""
        from timm.models.cait import Cait

        kind = type(model)
        return (
            getattr(kind, "forward_features", None) is Cait.forward_features
            and getattr(kind, "forward_cls", None) is getattr(Cait, "forward_cls", None)
            and len(getattr(model, "blocks_token_only", None) or ()) > 0
            and all(isinstance(getattr(model, name, None), nn.Module) for name in ("patch_embed", "pos_drop", "blocks"))
        )

    def capture_hooks(self) -> list[Hook]:
        cait = self.module

        def at(part: str, position: int):
            def capture(mod: nn.Module, args: tuple, kwargs: dict) -> None:
                self.capture(args[position], output_edge(args[position]), part=part)

            return capture

        return [
            Hook(cait.patch_embed, False, self.start_call, first=False),
            Hook(cait.pos_drop, True, at("pos_embed", 0)),
            Hook(cait.blocks, False, self.start_call, first=False),
            Hook(cait.blocks_token_only[0], True, at("cls_token", 1)),
        ]

    def gradients_of(self, call: Capture, grad: Tensor, examples: int) -> dict[str, Tensor]:
        if call.part not in self.names:
            return {}
        return {call.part: group_rows(grad, examples).sum(dim=1).unsqueeze(1)}
