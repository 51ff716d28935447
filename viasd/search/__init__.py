"""Offline searches: DIMR routing masks (docs/method.md, "DIMR") and VIA-SD thresholds (docs/method.md,
"Threshold tuning"), with Optuna."""
