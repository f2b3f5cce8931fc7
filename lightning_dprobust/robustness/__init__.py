"""Robustness: attacks, certification reports and per-example robustness metrics."""
