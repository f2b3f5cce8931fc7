"""Privacy audits: membership-inference attacks (loss threshold, shadow models, LiRA), one-run canary audits, and the
retraining they need."""

from lightning_dprobust.audit.white_box import WhiteBoxReport, white_box_audit

__all__ = ["WhiteBoxReport", "white_box_audit"]
