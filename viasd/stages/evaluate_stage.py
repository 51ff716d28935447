"""`viasd evaluate --pair P --task T --run R`: the task's quality metrics for one decode output.

Output: reports/eval/<pair>/<task>/<run>.json — the decode summary (statistics, speedup vs ar)
plus `quality` (the task's metrics) and `quality_drop` (1 - agreement with the target's greedy
output).
"""

from __future__ import annotations

import json

from ..config import Params
from .decode_stage import StudyInputError, decode_paths


def eval_path(params: Params, pair: str, task: str, run: str):
    return params.reports_dir / "eval" / pair / task / f"{run}.json"


def run_evaluate_stage(params: Params, pair_name: str, task: str, run: str) -> dict:
    from ..evaluation import task_quality
    from ..io import write_json
    from ..models import load_models
    from ..tasks import get_task, load_examples

    paths = decode_paths(params, pair_name, task, run)
    if not paths["summary"].exists():
        raise StudyInputError(f"no decode output {paths['summary']}: run `viasd decode --pair {pair_name} "
                              f"--task {task} --run {run}` first")
    summary = json.loads(paths["summary"].read_text())
    rows = [json.loads(line) for line in paths["rows"].read_text().splitlines() if line.strip()]
    examples = {e.id: e for e in load_examples(params.data.dir, task, summary["split"])}
    missing = [r["id"] for r in rows if r["id"] not in examples]
    if missing:
        raise StudyInputError(f"{paths['rows']}: example {missing[0]!r} is not in the {summary['split']} split of "
                              f"{task}; the data changed since the decode ran")
    spec = get_task(task)
    models = None
    if "nll" in spec.metrics:
        pair = params.pair(pair_name)
        models = load_models(pair.target, device=params.device, dtype=pair.dtype,
                             trust_remote_code=pair.trust_remote_code)
    quality = task_quality(spec, [examples[r["id"]] for r in rows], rows, models)
    out = {**summary, "quality": quality,
           "quality_drop": 1.0 - quality["agreement"] if quality.get("agreement") is not None else None}
    write_json(eval_path(params, pair_name, task, run), out)
    return out
