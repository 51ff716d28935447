"""The study's series as CSV files for `dvc plots` (`reports/plot-data/`; dvc.yaml's top-level `plots:` gives each
its axes and template), so `dvc plots show` draws them and `dvc plots diff` draws two experiments' side by side.

  frontier.csv            every decoded run: speedup vs ar against fidelity and task drop (one row per pair, task, run)
  threshold-trials.csv    every threshold-search trial and tiers-off point on the dev split: cost per token, fidelity
  dimr-trace.csv          the DIMR search's trials: the mask cost, and the best so far
  training-loss-<role>.csv  the trained family's training loss per optimizer step (target, draft, independent)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..config import Params
from ..io import write_text
from ..study.paths import mask_paths, threshold_dirs
from .tables import csv_table

ROLES = ("target", "draft", "independent")


def _number(value):
    """A finite float, else None (an empty CSV cell: "inf" costs of pruned trials draw nothing)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def frontier_rows(by_cell: dict[tuple[str, str], list[dict]]) -> list[dict]:
    """One row per evaluated run: its cell, speedup vs ar (with the interval), fidelity, task drop, rejection rate."""
    rows = []
    for (pair, task), evals in by_cell.items():
        for e in evals:
            speed = (e.get("speed") or {}).get("vs_ar") or {}
            quality = e.get("quality") or {}
            rows.append({"cell": f"{pair}/{task}", "run": e["run"],
                         "speedup_vs_ar": _number(speed.get("ratio", e.get("speedup_vs_ar"))),
                         "speedup_low": _number(speed.get("low")), "speedup_high": _number(speed.get("high")),
                         "fidelity": _number(quality.get("fidelity")), "task_drop": _number(quality.get("task_drop")),
                         "rejection_rate": _number(e.get("rejection_rate"))})
    return rows


def threshold_rows(params: Params, pair: str, task: str) -> list[dict]:
    """Every point of the pair and task's threshold searches (each slim's trace): cost per token, fidelity."""
    rows = []
    for trace in sorted(threshold_dirs(params, task, pair)["models"].glob("*.trace.jsonl")):
        slim = trace.name.removesuffix(".trace.jsonl")
        for t in _jsonl(trace):
            rows.append({"cell": f"{pair}/{task}", "slim": slim, "trial": t.get("number"),
                         "tiers_off": bool(t.get("tiers_off")), "gamma": t.get("gamma"),
                         "cost_per_token_ms": None if _number(t.get("cost_per_token")) is None
                         else 1000 * _number(t.get("cost_per_token")),
                         "fidelity": _number(t.get("fidelity")), "task_drop": _number(t.get("task_drop")),
                         "feasible": t.get("feasible")})
    return rows


def dimr_rows(params: Params, pair: str) -> list[dict]:
    """The DIMR search's trials in order: the mask cost and the lowest so far."""
    rows, best = [], math.inf
    for t in _jsonl(mask_paths(params, pair)["trace"]):
        cost = _number(t.get("cost"))
        if cost is not None:
            best = min(best, cost)
        rows.append({"pair": pair, "trial": t.get("number"), "phase": t.get("phase"), "cost": cost,
                     "best_cost": None if math.isinf(best) else best})
    return rows


def loss_rows(model_dir: Path) -> list[dict]:
    """A trained model's loss curve (`training.json`'s `loss_curve`, every k-th optimizer step) as (step, loss)."""
    report = model_dir / "training.json"
    if not report.exists():
        return []
    t = json.loads(report.read_text())
    curve = t.get("loss_curve") or []
    stride = max(1, t.get("steps", len(curve)) // 200)
    return [{"step": i * stride, "loss": loss} for i, loss in enumerate(curve)]


def write_plot_data(params: Params, by_cell: dict[tuple[str, str], list[dict]]) -> list[Path]:
    """Write every series of the study under `reports/plot-data/`; returns the files written."""
    base = params.reports_dir / "plot-data"
    files = {base / "frontier.csv": frontier_rows(by_cell),
             base / "threshold-trials.csv": [r for pair, task in by_cell for r in threshold_rows(params, pair, task)],
             base / "dimr-trace.csv": [r for pair in params.study.pairs for r in dimr_rows(params, pair)]}
    if params.family.name in params.study.pairs:  # the trained family (hub pairs are not trained here)
        for role in ROLES:
            files[base / f"training-loss-{role}.csv"] = loss_rows(params.model_dir(role))
    written = []
    for path, rows in files.items():
        if rows:
            write_text(path, csv_table(rows))
            written.append(path)
    return written
