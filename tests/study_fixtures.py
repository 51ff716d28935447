"""A smoke study in a temporary directory: params.yaml merged with config/smoke.yaml plus overrides."""

from __future__ import annotations

from pathlib import Path

import yaml

from viasd.config import deep_merge

REPO = Path(__file__).resolve().parent.parent


def smoke_params(tmp: Path, overrides: dict | None = None) -> Path:
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw = deep_merge(raw, yaml.safe_load((REPO / "config" / "smoke.yaml").read_text()))
    raw = deep_merge(raw, overrides or {})
    path = Path(tmp) / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path
