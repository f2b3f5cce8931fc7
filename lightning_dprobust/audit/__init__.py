"""Privacy audits: membership-inference attacks (loss threshold, shadow models, LiRA, the Salem et al. protocol of
the papers the methods reproduce), one-run canary audits (black- and white-box), and the retraining they need."""

from lightning_dprobust.audit.salem import (
    AttackMLP,
    SalemReport,
    SalemSplit,
    salem_attack,
    salem_audit,
    salem_checkpoint_audit,
    salem_split,
)
from lightning_dprobust.audit.white_box import WhiteBoxReport, white_box_audit

__all__ = [
    "AttackMLP",
    "SalemReport",
    "SalemSplit",
    "WhiteBoxReport",
    "salem_attack",
    "salem_audit",
    "salem_checkpoint_audit",
    "salem_split",
    "white_box_audit",
]
