"""Ghost engine == vmap engine: every registry model, every method's loss, random and adversarial inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_dprobust.core.engines import build_clipper
from lightning_dprobust.core.ghost import EngineMismatch, GhostClipper
from lightning_dprobust.core.ghost.conv import Conv1dRule, Conv2dRule
from lightning_dprobust.core.ghost.functional import BroadcastRule
from lightning_dprobust.core.ghost.layers import (
    ChannelScaleRule,
    CompositeRule,
    LayerScaleRule,
    LinearRule,
    MaterializedRule,
)
from lightning_dprobust.core.ghost.norms import NormRule
from lightning_dprobust.core.ghost.plan import plan_rules
from lightning_dprobust.core.ghost.tokens import CaiTTokenRule, CrossViTTokenRule, TokenRule
from lightning_dprobust.core.per_sample import PerExampleClipper, clip_factors, per_example_norms
from lightning_dprobust.methods import DPSGD, DPAdv, DPCert, TransDenoiser
from lightning_dprobust.robustness.attacks import build_attack
from tests.core.ghost_checks import without_vmap_checks

CROSSVIT_KWARGS = {
    "img_size": 48,
    "img_scale": (1.0, 1.0),
    "depth": ([1, 1, 0],),
    "embed_dim": [16, 32],
    "num_heads": [2, 2],
    "mlp_ratio": [2, 2, 1],
}
SWIN_KWARGS = {
    "img_size": 16,
    "patch_size": 2,
    "window_size": 4,
    "embed_dim": 16,
    "depths": (2, 2),
    "num_heads": (2, 4),
}
CAIT_KWARGS = {"img_size": 16, "patch_size": 4, "embed_dim": 16, "depth": 3, "num_heads": 2, "init_values": 0.5}
MODELS = {  # registry name (+ a variant's label) -> input shape, model kwargs
    "cnn_tanh": ((1, 14, 14), {}),
    "mlp_tanh": ((1, 8, 8), {}),
    "timm/resnet18": ((3, 8, 8), {}),
    "timm/vit_tiny_patch16_224": ((3, 16, 16), {"img_size": 16, "patch_size": 4, "depth": 2}),
    # DeiT's distillation token next to the class token
    "timm/deit_tiny_distilled_patch16_224": ((3, 16, 16), {"img_size": 16, "patch_size": 4, "depth": 2}),
    # two branches (patch sizes 12 and 16) with their own class tokens and position embeddings, one shared pos_drop
    "timm/crossvit_tiny_240": ((3, 48, 48), CROSSVIT_KWARGS),
    # LayerScale after attention and MLP (init_values; large enough to matter)
    "timm/vit_tiny_patch16_224+layer_scale": (
        (3, 16, 16),
        {"img_size": 16, "patch_size": 4, "depth": 2, "init_values": 0.5},
    ),
    "preact_resnet8": ((3, 8, 8), {"dp_compatible": True}),
    # window attention owning a relative position bias table (composite rule), shifted windows with a shared mask
    "timm/swin_tiny_patch4_window7_224": ((3, 16, 16), SWIN_KWARGS | {"drop_path_rate": 0.0}),
    # blocks' layer scales (block scale rule), class-attention blocks that take the class token as a second input
    "timm/cait_xxs24_224": ((3, 16, 16), CAIT_KWARGS),
    # depthwise convolutions (kept, and dropped on the 1x1 maps), GroupNormAct with Hardswish and ReLU, squeeze-excite
    "timm/mobilenetv3_small_050": ((3, 16, 16), {}),
    # depthwise 7x7 convolutions, LayerNorm2d, layer scale (gamma: large enough to matter)
    "timm/convnext_atto": ((3, 32, 32), {"ls_init_value": 0.5}),
    # ECA attention: a Conv1d across each block's pooled channels (a variant of the registry's timm/resnet18)
    "timm/resnet18+eca": ((3, 8, 8), {"block_args": {"attn_layer": "eca"}}),
    # two members, each a GroupNorm ResNet8 with its residual blocks hooked (noise off: gamma = 0 by default)
    "residual_perturbation": ((3, 8, 8), {"base_kwargs": {"dp_compatible": True}, "ensemble_size": 2}),
}
# timm transformers whose parameters outside layer calls are captured on the graph (core/ghost/functional.py)
GRAPH_CAPTURED = {
    # class token and absolute position embedding, blocks' gamma_1/gamma_2, attention's qkv.weight through F.linear
    "timm/beit_base_patch16_224": (
        (3, 16, 16),
        {"img_size": 16, "patch_size": 4, "embed_dim": 16, "depth": 2, "num_heads": 2, "use_abs_pos_emb": True},
    ),
    # class token and position embedding, rotary embeddings (buffers), qkv.weight through F.linear
    "timm/eva02_tiny_patch14_224": ((3, 16, 16), {"img_size": 16, "patch_size": 4, "depth": 2}),
    # four stages' class tokens, convolutional relative position encodings
    "timm/coat_lite_tiny": (
        (3, 32, 32),
        {
            "img_size": 32,
            "embed_dims": [16, 16, 16, 16],
            "serial_depths": [1, 1, 1, 1],
            "num_heads": 8,
            "mlp_ratios": [2, 2, 2, 2],
        },
    ),
    # class token, blocks' gamma1/gamma2/gamma3, a Fourier position encoding projected once and repeated per example
    "timm/xcit_nano_12_p16_224": (
        (3, 16, 16),
        {"img_size": 16, "patch_size": 8, "embed_dim": 16, "depth": 2, "num_heads": 2, "cls_attn_layers": 1},
    ),
}
MODELS |= GRAPH_CAPTURED
MAXXVIT_KWARGS = {"img_size": 32, "embed_dim": (16, 16, 32, 32), "depths": (1, 1, 1, 1), "stem_width": 16}
MODELS |= {  # attention re-run per example for its relative position bias table, read without a call of its module
    "timm/coatnet_nano_rw_224": ((3, 32, 32), {**MAXXVIT_KWARGS, "transformer_dim_head": 8}),
    "timm/maxvit_nano_rw_256": ((3, 32, 32), {**MAXXVIT_KWARGS, "transformer_dim_head": 8}),
}
DPCERT_VARIANTS = [
    {"augmentation": "gaussian", "regularizer": "none"},
    {"augmentation": "gaussian", "regularizer": "stability"},
    {"augmentation": "gaussian", "regularizer": "macer"},
    {"augmentation": "gaussian", "regularizer": "consistency"},
    {"augmentation": "smoothadv", "regularizer": "none", "smoothadv_steps": 1},
]


pytestmark = pytest.mark.usefixtures("double_precision")


def build(method: type, model: str, **kwargs) -> nn.Module:
    torch.manual_seed(0)
    shape, model_kwargs = MODELS[model]
    return method(model=model.partition("+")[0], num_classes=10, input_shape=shape, model_kwargs=model_kwargs, **kwargs)


def images(module: nn.Module, size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand((size, *module.input_shape), generator=generator)
    return x, torch.randint(0, 10, (size,), generator=generator)


def assert_engines_agree(module: nn.Module, inputs: tuple[torch.Tensor, ...], clipping: str = "flat") -> None:
    """The ghost clipped sum equals the vmap engine's (same clip factors on its per-example gradients)."""
    per_example, _ = PerExampleClipper(module, "per_example_loss", 1.0).per_example_gradients(inputs)
    norms = per_example_norms(per_example)
    bound = float(norms.median())  # about half the examples are clipped
    factors = clip_factors(norms, bound, clipping)
    expected = {name: torch.einsum("b,b...->...", factors, g) for name, g in per_example.items()}
    ghost = GhostClipper(module, "per_example_loss", bound, clipping=clipping)
    without_vmap_checks(ghost)  # the comparison below is the full check
    actual = ghost(inputs)
    assert not ghost.fallback_names
    torch.testing.assert_close(actual.norms, norms, rtol=1e-5, atol=1e-12)
    assert actual.grads.keys() == expected.keys()
    for name, grad in expected.items():
        scale = grad.norm().clamp_min(1e-12)
        assert (actual.grads[name] - grad).norm() / scale <= 1e-5, name


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("size", [1, 5])
def test_dpsgd_random_inputs(model, size):
    module = build(DPSGD, model)
    assert_engines_agree(module, images(module, size))


@pytest.mark.parametrize("model", list(MODELS))
def test_dpadv_adversarial_inputs(model):
    module = build(DPAdv, model, attack="PGD", attack_eps=0.1, attack_kwargs={"steps": 2})
    x, y = images(module, 3, seed=1)
    adversarial = build_attack("PGD", module, 0.1, steps=2)(x, y)
    assert not torch.equal(adversarial, x)
    assert_engines_agree(module, (adversarial, y))


def dpcert_cases() -> list:
    """Every variant on the CNN, the timm ResNet, the ViT and the GroupNorm ResNet8."""
    models = ("cnn_tanh", "timm/resnet18", "timm/vit_tiny_patch16_224", "preact_resnet8")
    return [
        pytest.param(m, v, id=f"{m}-{v['augmentation']}-{v['regularizer']}") for v in DPCERT_VARIANTS for m in models
    ]


@pytest.mark.parametrize(("model", "variant"), dpcert_cases())
def test_dpcert_augmentation_groups(model, variant):
    module = build(DPCert, model, num_augmentations=2, **variant)
    inputs = module.training_inputs(images(module, 3, seed=2))
    assert inputs[0].shape[1] == 3  # clean view + 2 augmentations: one example, three rows
    assert_engines_agree(module, inputs)


@pytest.mark.parametrize("model", ["timm/swin_tiny_patch4_window7_224", "timm/cait_xxs24_224"])
def test_dpcert_augmentation_groups_through_re_runs_block_scales_and_cait_tokens(model):
    """Three rows per example through the composite rule's re-runs (Swin's window attention), the block scale rule
    (CaiT's blocks and class-attention blocks) and CaiT's token rule."""
    module = build(DPCert, model, num_augmentations=2, **DPCERT_VARIANTS[0])
    assert_engines_agree(module, module.training_inputs(images(module, 3, seed=2)))


@pytest.mark.parametrize("clipping", ["psac", "automatic"])
def test_dpcert_psac_and_automatic_clipping(clipping):
    module = build(DPCert, "cnn_tanh", num_augmentations=1)
    assert_engines_agree(module, module.training_inputs(images(module, 4, seed=3)), clipping)


@pytest.mark.parametrize("model", list(MODELS))
def test_empty_batch_gives_zero_sum_and_no_norms(model):
    module = build(DPSGD, model)
    out = GhostClipper(module, "per_example_loss", 1.0)(images(module, 0))
    assert out.norms.numel() == 0
    assert all(g.abs().sum() == 0 for g in out.grads.values())


@pytest.mark.parametrize("size", [1, 3])
def test_transdenoiser_dncnn_gn(size):
    """TransDenoiser's denoising loss on the registry's ``dncnn_gn`` (GroupNorm, residual ``z - r(z)``)."""
    torch.manual_seed(0)
    classifier = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10))
    module = TransDenoiser(
        classifier=classifier,
        num_classes=10,
        input_shape=(3, 8, 8),
        denoiser_kwargs={"width": 8, "depth": 3, "groups": 2},
    )
    x, _ = images(module, size, seed=7)
    inputs = module.training_inputs((x, None))
    assert not torch.equal(inputs[0], inputs[1])
    assert_engines_agree(module, inputs)


def test_chunked_equals_unchunked():
    module = build(DPSGD, "cnn_tanh")
    inputs = images(module, 7, seed=4)
    whole = GhostClipper(module, "per_example_loss", 0.05)(inputs)
    chunked = GhostClipper(module, "per_example_loss", 0.05, max_physical_batch_size=3)(inputs)
    torch.testing.assert_close(whole.norms, chunked.norms)
    for name in whole.grads:
        torch.testing.assert_close(whole.grads[name], chunked.grads[name])


def test_rules_cover_the_registry_models_without_fallback():
    kinds = {type(rule) for model in MODELS for rule in plan_rules(build(DPSGD, model))[0]}
    rules = {
        LinearRule,
        Conv2dRule,
        Conv1dRule,
        NormRule,
        TokenRule,
        CrossViTTokenRule,
        CaiTTokenRule,
        LayerScaleRule,
        ChannelScaleRule,
        CompositeRule,
        BroadcastRule,
        MaterializedRule,  # CoAtNet's and MaxViT's bias tables, handed to their attention's re-run at the first step
    }
    assert kinds == rules
    assert all(not plan_rules(build(DPSGD, model))[1] for model in MODELS)


def test_the_crossvit_rule_reads_timm_releases_that_embed_inside_forward_features(monkeypatch):
    """timm 1.0.29's ``CrossVit`` has no ``_embed``: its ``forward_features`` embeds. The rule then checks that
    method (it raised AttributeError), and still refuses a subclass that replaces it."""
    from timm.models.crossvit import CrossVit

    crossvit = next(m for m in build(DPSGD, "timm/crossvit_tiny_240").modules() if isinstance(m, CrossVit))
    assert CrossViTTokenRule.supports(crossvit)
    monkeypatch.delattr(CrossVit, "_embed", raising=False)  # absent in timm 1.0.29
    assert CrossViTTokenRule.supports(crossvit)
    crossvit.__class__ = type("OwnFeatures", (CrossVit,), {"forward_features": lambda self, x: x})
    assert not CrossViTTokenRule.supports(crossvit)


def _cait_1029_forward_features(self, x):
    """timm 1.0.29's ``Cait.forward_features``: the class-attention loop inline, no ``forward_cls``."""
    x = self.pos_drop(self.patch_embed(x) + self.pos_embed)
    x = self.blocks(x)
    cls_tokens = self.cls_token.expand(x.shape[0], -1, -1)
    for block in self.blocks_token_only:
        cls_tokens = block(x, cls_tokens)
    return self.norm(torch.cat((cls_tokens, x), dim=1))


def test_the_cait_rule_reads_timm_releases_without_forward_cls(monkeypatch):
    """timm 1.0.29's ``Cait`` has no ``forward_cls`` (the rule raised AttributeError on the GPU machine's timm): the
    rule takes that release's ``forward_features`` and its norms equal the vmap engine's; a subclass that replaces
    ``forward_features`` is still refused."""
    from timm.models.cait import Cait

    monkeypatch.delattr(Cait, "forward_cls", raising=False)
    monkeypatch.setattr(Cait, "forward_features", _cait_1029_forward_features)
    module = build(DPSGD, "timm/cait_xxs24_224")
    cait = next(m for m in module.modules() if isinstance(m, Cait))
    assert CaiTTokenRule.supports(cait)
    assert any(isinstance(rule, CaiTTokenRule) for rule in plan_rules(module)[0])
    assert_engines_agree(module, images(module, 3))
    cait.__class__ = type("OwnFeatures", (Cait,), {"forward_features": lambda self, x: x})
    assert not CaiTTokenRule.supports(cait)


class ViewMajor(DPCert):
    """A loss that lays the views out view-major: rows are no longer grouped by example."""

    def per_example_loss(self, views, y):
        batch, num_views = views.shape[:2]
        logits = self(views.transpose(0, 1).flatten(0, 1)).view(num_views, batch, -1)
        return F.cross_entropy(logits.flatten(0, 1), y.repeat(num_views), reduction="none").view(num_views, -1).mean(0)


def test_a_loss_that_breaks_the_row_layout_is_caught_on_the_first_step():
    module = build(ViewMajor, "mlp_tanh", num_augmentations=2)
    inputs = module.training_inputs(images(module, 4, seed=5))
    with pytest.raises(EngineMismatch, match="differ from the vmap"):
        GhostClipper(module, "per_example_loss", 1.0)(inputs)
    auto, _ = build_clipper("auto", module, "per_example_loss", 1.0)
    expected = PerExampleClipper(module, "per_example_loss", 1.0)(inputs)
    torch.testing.assert_close(auto(inputs).norms, expected.norms)
    assert auto._use_reference


class Projected(nn.Module):
    """A module owning a projection it applies by a matrix product, and a child with parameters: no layer rule, and
    no graph capture either (``core/ghost/functional.py`` takes expands, adds and products that broadcast a
    parameter, and ``F.linear`` products of a linear layer's weight)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Parameter(torch.randn(64, 16) / 8)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(x.flatten(1) @ self.proj)


def test_parameters_without_a_rule_fall_back_to_vmap_and_auto_switches_to_vmap():
    module = DPSGD(model=Projected(), num_classes=10, input_shape=(1, 8, 8))
    ghost = GhostClipper(module, "per_example_loss", 0.1)
    inputs = images(module, 5, seed=6)
    expected = PerExampleClipper(module, "per_example_loss", 0.1)(inputs)
    actual = ghost(inputs)
    assert ghost.fallback_names == ["model.proj"]
    torch.testing.assert_close(actual.norms, expected.norms)
    for name in expected.grads:
        torch.testing.assert_close(actual.grads[name], expected.grads[name])
    auto, choice = build_clipper("auto", module, "per_example_loss", 0.1)
    assert isinstance(auto, GhostClipper) and "BroadcastRule: 1" in choice
    torch.testing.assert_close(auto(inputs).norms, expected.norms)
    assert auto._use_reference  # vmap for every parameter from then on


def test_in_place_change_of_a_captured_input_is_refused():
    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(64, 8), nn.Linear(8, 10)

        def forward(self, x):
            h = self.fc1(x.flatten(1))
            out = self.fc2(h)
            h.add_(1.0)  # modifies fc2's input after fc2 used it; autograd does not notice (no weight gradient)
            return out

    module = DPSGD(model=InPlace(), num_classes=10, input_shape=(1, 8, 8))
    with pytest.raises(RuntimeError, match="inplace operation|modified in place"):
        GhostClipper(module, "per_example_loss", 1.0)(images(module, 2))


def test_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="engine must be one of"):
        build_clipper("opacus", build(DPSGD, "mlp_tanh"), "per_example_loss", 1.0)
