"""On a CUDA device: the engines agree there and with the CPU, and DPCallback's clipping and noise hold there.

Marked ``gpu`` and skipped where no CUDA device is present (CI has none); run with ``pytest -m gpu tests/test_cuda.py``
on a machine with one.
"""

from __future__ import annotations

import pytest
import torch

from lightning_dprobust.callbacks import DPCallback
from lightning_dprobust.core.ghost import GhostClipper
from lightning_dprobust.core.per_sample import PerExampleClipper
from lightning_dprobust.methods import DPSGD
from tests.core.test_ghost import MODELS, assert_engines_agree, build, images
from tests.helpers import GradientRecorder, ZeroGradient, digits, quiet_trainer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

N_TRAIN = 1293


@pytest.mark.usefixtures("double_precision")
@pytest.mark.parametrize("model", list(MODELS))
def test_ghost_equals_vmap_on_cuda(model):
    module = build(DPSGD, model).cuda()
    x, y = images(module, 5)
    assert_engines_agree(module, (x.cuda(), y.cuda()))


def relative_gap(result, reference) -> float:
    """The largest relative difference of two clipped results: per-example norms, and each clipped sum in norm."""
    gaps = [((result.norms.cpu() - reference.norms) / reference.norms).abs().max()]
    gaps += [(result.grads[n].cpu() - g).norm() / g.norm().clamp_min(1e-12) for n, g in reference.grads.items()]
    return float(max(gaps))


@pytest.mark.usefixtures("double_precision")
@pytest.mark.parametrize("model", list(MODELS))
def test_cuda_clipped_sum_equals_the_cpu_one(model):
    """The ghost engine's CUDA routes give its CPU result to 1e-7, or to four times the gap of the vmap engine, which
    runs the model as it is, where the model's own gradients differ between the devices by more: torch's CUDA
    ``Hardswish`` and ``Hardsigmoid`` differ from the CPU ones by 3e-8 in float64 (torch 2.11, H100), so MobileNetV3's
    logits differ by 2e-7 and its per-example gradient norms by 1e-6."""
    module = build(DPSGD, model)
    inputs = images(module, 5)
    cpu = [clipper(module, "per_example_loss", 1.0)(inputs) for clipper in (GhostClipper, PerExampleClipper)]
    module.cuda()
    inputs = tuple(t.cuda() for t in inputs)
    cuda = [clipper(module, "per_example_loss", 1.0)(inputs) for clipper in (GhostClipper, PerExampleClipper)]
    model_gap = relative_gap(cuda[1], cpu[1])
    assert relative_gap(cuda[0], cpu[0]) <= max(1e-7, 4 * model_gap)


@pytest.mark.parametrize("engine", ["vmap", "ghost"])
def test_noise_drawn_on_the_gpu_has_std_noise_multiplier_times_clip(tmp_path, engine):
    recorder = GradientRecorder()
    callback = DPCallback(max_grad_norm=0.5, noise_multiplier=2.0, delta=1e-5, engine=engine)
    trainer = quiet_trainer(tmp_path, accelerator="gpu", max_steps=3, callbacks=[callback, recorder])
    module = ZeroGradient(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8))
    trainer.fit(module, digits(batch_size=128))
    assert all(grad.is_cuda for grad in recorder.grads)
    noise_on_sum = torch.cat(recorder.grads).cpu() * callback.loaders.sample_rate * N_TRAIN
    assert noise_on_sum.mean().abs() < 0.05
    assert noise_on_sum.std().item() == pytest.approx(1.0, rel=0.03)
    assert callback.epsilon() > 0


def test_clipped_updates_on_the_gpu_are_bounded_by_the_clip(tmp_path):
    """Zero noise: each step's summed update has norm at most ``max_grad_norm`` times the batch's examples."""
    recorder = GradientRecorder()
    callback = DPCallback(max_grad_norm=0.01, noise_multiplier=0.0, delta=1e-5, poisson_sampling=False)
    trainer = quiet_trainer(tmp_path, accelerator="gpu", max_steps=3, callbacks=[callback, recorder])
    module = DPSGD(model="cnn_tanh", num_classes=10, input_shape=(1, 8, 8), lr=0.5)
    with pytest.warns(UserWarning, match="approximation"):
        trainer.fit(module, digits(batch_size=64))
    for grad in recorder.grads:  # the average over the 64 examples of clipped gradients
        assert 0 < grad.norm().item() <= 0.01 * (1 + 1e-5)


@pytest.mark.parametrize("settings", ["tf32_on", "default_tf32"])
def test_with_tf32_on_the_check_passes_and_each_examples_share_stays_within_the_clip(request, settings):
    """TF32 (cuDNN's default) made the first-step check fail on ResNet-18 (norms ~1e-3 apart) when it was on
    throughout: the check runs without it, and so do the products that form the norms and the clipped sums, while
    the forward, the backward and the kept per-example gradients (the stem's, with cuDNN's setting) keep it. A
    one-example batch's clipped sum is that example's share: within the clip."""
    request.getfixturevalue(settings)
    torch.manual_seed(0)
    module = DPSGD(model="timm/resnet18", num_classes=10, input_shape=(3, 32, 32)).cuda()
    x, y = torch.rand(16, 3, 32, 32, device="cuda"), torch.randint(0, 10, (16,), device="cuda")
    ghost = GhostClipper(module, "per_example_loss", 1e-3)
    assert torch.isfinite(ghost((x, y)).norms).all() and not ghost._use_reference
    for i in range(8):
        result = ghost((x[i : i + 1], y[i : i + 1]))
        share = torch.linalg.vector_norm(torch.cat([g.flatten() for g in result.grads.values()]))
        assert result.norms.item() > 1e-3 and share.item() <= 1e-3 * (1 + 1e-5), i
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (True, settings == "tf32_on")
