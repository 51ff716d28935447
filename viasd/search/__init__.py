"""Offline searches: DIMR routing masks (docs/method.md (DIMR)) and VIA-SD thresholds (§2.4), with Optuna."""
