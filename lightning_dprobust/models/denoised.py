"""``DenoisedClassifier``: a classifier behind a denoiser, ``h(g(x))`` (denoised smoothing).

Salman, Sun, Yang, Kapoor, Kolter 2020, "Denoised Smoothing: A Provable Defense for Pretrained Classifiers"
(https://arxiv.org/abs/2003.01908); TransDenoiser (Tang 2021, thesis chapter 6) trains ``g`` with DP.
"""

from __future__ import annotations

import torch
from torch import nn


class DenoisedClassifier(nn.Module):
    """Logits of ``classifier(denoiser(x))`` for images ``x`` in ``[0, 1]``; randomized smoothing certifies it.

    Args:
        classifier: maps ``[0, 1]`` images to logits.
        denoiser: maps ``[0, 1]`` images (plus noise) to ``[0, 1]`` images of the same shape.
    """

    def __init__(self, classifier: nn.Module, denoiser: nn.Module) -> None:
        super().__init__()
        self.classifier = classifier
        self.denoiser = denoiser

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the classifier's logits on the denoised images."""
        return self.classifier(self.denoiser(x))
