"""Privacy audits that measure an empirical lower bound on epsilon (white-box one-run audit with gradient canaries)."""

from lightning_dprobust.audit.white_box import WhiteBoxReport, white_box_audit

__all__ = ["WhiteBoxReport", "white_box_audit"]
