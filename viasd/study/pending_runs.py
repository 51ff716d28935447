"""Runs the MLflow store could not take, kept on disk until it can: a stage whose store is unreachable (a tracking
server down) still succeeds, its run waits in `<root>/.viasd/pending-runs/`, and the next `viasd` command that
reaches the store records it, once (`deliver_pending`: every stage's start and `tracking-init`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

from .tracking import open_run, record_children, record_into, retrying, run_tags, study_root, tracking_uri

log = logging.getLogger(__name__)

PENDING = Path(".viasd") / "pending-runs"  # under the study's root: runs the store could not take yet


def spool_run(root: Path, experiment: str, run_name: str, params: dict, metrics: dict, tags: dict,
              artifacts: Iterable[Path] = (), series: dict | None = None, children: list[dict] | None = None,
              run_id: str | None = None) -> Path:
    """Keep a stage's run that the store could not take (a tracking server down, a store unreachable) in
    `<root>/.viasd/pending-runs/`, with the tags it had now (source, parent run), until `deliver_pending`
    records it: nothing is lost, and it is recorded once (into `run_id`, the run opened when the stage
    started, if the store has it: no run is left RUNNING). Returns the file."""
    import json
    import uuid

    from ..io import write_text

    record = {"experiment": experiment, "run_name": run_name, "params": params, "metrics": metrics,
              "tags": run_tags(root, run_name, tags), "artifacts": [str(Path(a).resolve()) for a in artifacts],
              "series": series or {}, "children": children or [], "store": tracking_uri(root), "run_id": run_id}
    path = study_root(root) / PENDING / f"{time.time_ns()}-{uuid.uuid4().hex[:8]}.json"
    write_text(path, json.dumps(record, default=str, sort_keys=True))
    return path


def deliver_pending(root: Path) -> int:
    """Record the runs `spool_run` kept, oldest first, each once (its file removed when it is recorded);
    stops at the first the store still cannot take. Returns how many were delivered."""
    import json

    delivered = 0
    for path in sorted((study_root(root) / PENDING).glob("*.json")):
        record = json.loads(path.read_text())
        run_id = record.get("run_id") if _exists(root, record.get("run_id")) else None
        run_id = run_id or open_run(root, record["experiment"], record["run_name"], record["tags"], nested=False)
        if run_id is None or not retrying(lambda r=record, i=run_id: record_into(
                root, i, r["run_name"], r["params"], r["metrics"], r["tags"], r["artifacts"], r["series"]),
                "record the run"):
            return delivered
        path.unlink()  # recorded: never again, even if its trials below fail to log
        if record["children"]:
            record_children(root, record["experiment"], run_id, record["children"])
        delivered += 1
        log.warning("delivered the pending MLflow run %s to %s", record["run_name"], tracking_uri(root))
    return delivered


def _exists(root: Path, run_id: str | None) -> bool:
    """Whether the store has the run `run_id` (False when it cannot be asked)."""
    from mlflow.tracking import MlflowClient

    if not run_id:
        return False
    try:
        MlflowClient(tracking_uri(root)).get_run(run_id)
        return True
    except Exception:  # noqa: BLE001 - not there, or the store unreachable: a new run is opened
        return False
