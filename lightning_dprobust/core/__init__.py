"""Framework-free math: accounting, per-example clipping, sampling, smoothing (no Lightning imports)."""
