"""lightning-dprobust: differentially private and adversarially robust deep learning as PyTorch Lightning modules."""

__version__ = "0.1.0"
