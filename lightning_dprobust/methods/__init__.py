"""One LightningModule per paper; shared steps live in :mod:`lightning_dprobust.methods.base`."""

from lightning_dprobust.methods.base import ClassifierModule
from lightning_dprobust.methods.dpadv import DPAdv
from lightning_dprobust.methods.dpcert import DPCert
from lightning_dprobust.methods.dpsgd import DPSGD
from lightning_dprobust.methods.igamt import IGAMT
from lightning_dprobust.methods.registry import register_method
from lightning_dprobust.methods.residual import ResidualPerturbation
from lightning_dprobust.methods.transdenoiser import TransDenoiser

__all__ = [
    "DPSGD",
    "ClassifierModule",
    "DPAdv",
    "DPCert",
    "IGAMT",
    "ResidualPerturbation",
    "TransDenoiser",
    "register_method",
]
