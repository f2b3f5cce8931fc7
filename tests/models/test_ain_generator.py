"""AIN's generator: output bound, label conditioning, noise at test time (thesis section 5.2.2; spec 9.3 items 1, 3,
4)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lightning_dprobust.models import AINGenerator, create_model
from lightning_dprobust.models.ain import ConditionalStateExtractor

SHAPE = (1, 8, 8)


def _generator(**kwargs) -> AINGenerator:
    torch.manual_seed(0)
    return AINGenerator(10, SHAPE, channels=(8, 8, 8, 8), **kwargs)


@pytest.mark.parametrize("bound", [0.0, 0.05, 0.3, 1.0])
def test_the_output_stays_within_the_bound_and_the_pixel_range(bound):
    generator = _generator()
    with torch.no_grad():  # make the raw output large, so the clipping is what bounds it
        generator.decoder[-1].bias.fill_(5.0)
    x = torch.rand(16, *SHAPE)
    x[0] = 0.0
    x[1] = 1.0
    out = generator(x, torch.arange(16) % 10, bound)
    assert (out - x).abs().max() <= bound + 1e-7
    assert out.min() >= 0.0 and out.max() <= 1.0
    if bound > 0:
        assert (out - x).abs().max() >= 0.99 * min(bound, (1 - x).max())  # the bound is reached, not undershot


def test_the_default_bound_is_the_buffer_that_training_sets():
    generator = _generator()
    generator.bound.fill_(0.1)
    x = torch.full((4, *SHAPE), 0.5)
    assert (generator(x, torch.zeros(4, dtype=torch.long)) - x).abs().max() <= 0.1 + 1e-7
    assert set(generator.state_dict()) >= {"bound", "target_class"}


def test_the_label_state_has_the_image_size_and_the_layer_norm_range():
    extractor = ConditionalStateExtractor(10, 8, 8)
    state, logits = extractor(torch.arange(10))
    assert state.shape == (10, 1, 8, 8) and logits.shape == (10, 10)
    flat = state.flatten(1)
    assert torch.allclose(flat.mean(dim=1), torch.zeros(10), atol=1e-5)
    assert torch.allclose(flat.var(dim=1, unbiased=False), torch.ones(10), atol=1e-2)  # LayerNorm eps


def test_the_label_state_is_concatenated_on_the_channel_axis():
    generator = _generator()
    first = generator.encoder[0][0]
    assert first.in_channels == SHAPE[0] + 1
    seen = {}
    first.register_forward_hook(lambda module, inputs, output: seen.update(input=inputs[0]))
    x, labels = torch.rand(3, *SHAPE), torch.tensor([0, 4, 9])
    generator(x, labels, 0.1)
    assert seen["input"].shape == (3, SHAPE[0] + 1, 8, 8)
    assert torch.equal(seen["input"][:, :1], x)
    assert torch.allclose(seen["input"][:, 1:], generator.extractor(labels)[0])


def test_the_extractor_learns_to_reconstruct_one_hot_labels():
    torch.manual_seed(0)
    extractor = ConditionalStateExtractor(10, 8, 8)
    optimizer = torch.optim.Adam(extractor.parameters(), lr=1e-2)
    labels = torch.arange(10)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(extractor(labels)[1], labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_noise_is_active_in_eval_mode_unless_its_std_is_zero():
    x, labels = torch.rand(4, *SHAPE), torch.tensor([1, 2, 3, 4])
    noisy = _generator(noise_std=0.5).eval()
    with torch.no_grad():
        assert not torch.equal(noisy(x, labels, 0.5), noisy(x, labels, 0.5))
    plain = _generator(noise_std=0.0).eval()
    with torch.no_grad():
        assert torch.equal(plain(x, labels, 0.5), plain(x, labels, 0.5))


def test_the_noise_comes_from_the_given_generator():
    generator = _generator(noise_std=0.5).eval()
    x, labels = torch.rand(4, *SHAPE), torch.tensor([1, 2, 3, 4])
    with torch.no_grad():
        first = generator(x, labels, 0.5, torch.Generator().manual_seed(3))
        torch.manual_seed(123)  # the global RNG plays no part
        second = generator(x, labels, 0.5, torch.Generator().manual_seed(3))
    assert torch.equal(first, second)


def test_the_registry_builds_it_and_bad_shapes_are_refused():
    model = create_model("ain_generator", num_classes=10, input_shape=(3, 64, 64), channels=(4, 4, 4, 4))
    assert isinstance(model.net, AINGenerator)
    with pytest.raises(ValueError, match="divisible by 4"):
        AINGenerator(10, (1, 30, 30))
    with pytest.raises(ValueError, match="noise_std >= 0"):
        AINGenerator(10, SHAPE, noise_std=-1.0)
