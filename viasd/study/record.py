"""What a stage run reports: one `StageRecord` per MLflow run, built by the stage from what it holds in
memory (its parameters, results, trials and files), which the tracking boundary (`viasd.cli`) logs as
it is. A stage never re-reads its own outputs to describe itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..config import Pair
from .runs import RunSpec


@dataclass
class StageRecord:
    """One MLflow run of a stage: its name, parameters, metrics, tags, artifacts (files it wrote), metric
    series (a curve per key), inputs (files whose DVC hashes tag the run), child runs (e.g. a search's
    trials, `{name, params, metrics}`) and datasets (task splits, MLflow dataset inputs). `up_to_date`: the
    stage found its outputs current and did nothing, so there is nothing to record."""

    stage: str
    name: str
    params: dict
    metrics: dict
    tags: dict = field(default_factory=dict)
    artifacts: list[Path] = field(default_factory=list)
    series: dict | None = None
    inputs: dict = field(default_factory=dict)
    children: list[dict] = field(default_factory=list)
    up_to_date: bool = False
    # the task splits it read, logged as MLflow dataset inputs: {name: (file, context)}, context "dev" or "test"
    datasets: dict = field(default_factory=dict)


def scalars(data: dict) -> dict:
    """The plain numbers and flags of `data` (what MLflow takes as metrics)."""
    return {k: v for k, v in data.items() if not isinstance(v, (dict, list, str))}


def cell_tags(pair: Pair, task: str, spec: RunSpec) -> dict:
    return {"pair": pair.name, "task": task, "method": spec.method, "ablation": spec.ablation or "none",
            "run": spec.name}
