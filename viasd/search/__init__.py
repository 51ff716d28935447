"""Offline searches: DIMR routing masks (DESIGN.md §2.3) and VIA-SD thresholds (§2.4), with Optuna."""
