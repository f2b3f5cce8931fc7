"""Models: a registry of paper architectures that timm lacks, timm models via ``timm/<arch>``, and DP helpers.

Every model built by :func:`create_model` takes unnormalized ``[0, 1]`` images: its first layer is
:class:`Normalize`. :func:`make_dp_compatible` and :func:`dp_incompatibilities` make and check networks fit for
per-example gradient clipping.
"""

from __future__ import annotations

from lightning_dprobust.models.ain import AINGenerator
from lightning_dprobust.models.cnn import CNNTanh, MLPTanh
from lightning_dprobust.models.denoised import DenoisedClassifier
from lightning_dprobust.models.dncnn import DnCNN
from lightning_dprobust.models.dp_compat import dp_incompatibilities, make_dp_compatible
from lightning_dprobust.models.normalize import Normalize, NormalizedModel
from lightning_dprobust.models.registry import create_model, list_models, register_model
from lightning_dprobust.models.residual_noise import Ensemble, PerturbedResidualNet, residual_blocks
from lightning_dprobust.models.resnet8 import PreActBlock, PreActResNet8
from lightning_dprobust.models.stobatch import StoBatchNet

__all__ = [
    "AINGenerator",
    "CNNTanh",
    "DenoisedClassifier",
    "DnCNN",
    "Ensemble",
    "MLPTanh",
    "Normalize",
    "NormalizedModel",
    "PerturbedResidualNet",
    "PreActBlock",
    "PreActResNet8",
    "StoBatchNet",
    "create_model",
    "dp_incompatibilities",
    "list_models",
    "make_dp_compatible",
    "register_model",
    "residual_blocks",
]
