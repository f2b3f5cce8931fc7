"""Privacy audits of trained models: membership-inference protocols of the papers the methods reproduce."""

from lightning_dprobust.audit.salem import AttackMLP, SalemReport, SalemSplit, salem_attack, salem_audit, salem_split

__all__ = ["AttackMLP", "SalemReport", "SalemSplit", "salem_attack", "salem_audit", "salem_split"]
