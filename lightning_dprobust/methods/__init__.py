"""One LightningModule per paper; shared steps live in :mod:`lightning_dprobust.methods.base`."""

from lightning_dprobust.methods.ain import AIN
from lightning_dprobust.methods.base import ClassifierModule, register_method
from lightning_dprobust.methods.dpadv import DPAdv
from lightning_dprobust.methods.dpcert import DPCert
from lightning_dprobust.methods.dpsgd import DPSGD
from lightning_dprobust.methods.igamt import IGAMT
from lightning_dprobust.methods.residual import ResidualPerturbation
from lightning_dprobust.methods.stobatch import StoBatch
from lightning_dprobust.methods.transdenoiser import TransDenoiser

__all__ = [
    "AIN",
    "DPSGD",
    "ClassifierModule",
    "DPAdv",
    "DPCert",
    "IGAMT",
    "ResidualPerturbation",
    "StoBatch",
    "TransDenoiser",
    "register_method",
]
