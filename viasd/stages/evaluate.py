"""`viasd evaluate --pair P --task T [--run R ...]`: the task's quality metrics for the decode outputs of
the study grid's runs for one pair and task (default: every run of `study.runs`). The target-scored
measures (fidelity, the target's NLL) come from the decode, which scored each output in one
teacher-forced pass; this stage loads no model, only the tokenizer.

Output per run: reports/eval/<pair>/<task>/<run>.json — the decode summary (statistics, speedup vs ar)
plus `quality`, the three measures of docs/quality.md: `fidelity` (its standard error `fidelity_se`,
clustered by source file, and the target's `nll`), the
task's metrics with the main one also scored on the `ar` output of the same prompts (`<metric>_ar`)
and its drop in points (`task_drop`), and `agreement`; and `speed`, the run's decode seconds per generated token
per prompt (prefill apart) and its paired ratio over `ar` with a 95 % interval clustered by source file
(`metrics.speed`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..config import Params
from ..errors import StudyInputError
from ..study.paths import decode_paths, eval_path, task_split
from ..study.record import StageRecord, cell_tags, scalars
from ..study.runs import RunSpec


def run_evaluate_stage(params: Params, pair_name: str, task: str, runs: Sequence[str] | None = None) -> list[dict]:
    """Evaluate the decode outputs of `runs` (default: `study.runs`); writes and returns one result each.
    Every run's decode output is checked before any is evaluated."""
    from ..models import load_tokenizer
    from ..study.runs import parse_run
    from ..tasks import get_task

    names = list(dict.fromkeys(parse_run(r).name for r in (runs or params.study.runs)))
    decoded = {name: _decoded(params, pair_name, task, name) for name in names}
    spec = get_task(task)
    pair = params.pair(pair_name)
    tokenizer = load_tokenizer(pair.target, pair.trust_remote_code)
    ar_scores: dict = {}  # the runs share one ar reference: its main metric is scored once
    return [_evaluate_run(params, pair_name, task, name, *decoded[name], spec, tokenizer, ar_scores)
            for name in names]


def _decoded(params: Params, pair_name: str, task: str, run: str) -> tuple[dict, list[dict], list]:
    """A run's decode summary, rows and the examples they answer; a clear error if it is missing or stale."""
    from ..tasks import load_examples

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
    return summary, rows, [examples[r["id"]] for r in rows]


def _evaluate_run(params: Params, pair_name: str, task: str, run: str, summary: dict, rows: list[dict], chosen: list,
                  spec, tokenizer, ar_scores: dict) -> dict:
    from ..evaluation.side_by_side import metric_score, task_drop_standard_error, task_quality
    from ..io import write_json
    from ..metrics.quality import main_metric, task_drop

    quality = task_quality(spec, chosen, rows)
    quality["fidelity"] = summary["fidelity"]  # pooled over the rows by the decode
    quality["fidelity_se"] = summary.get("fidelity_se")  # and its SE, by source file (none in older decodes)
    metric = main_metric(spec.metrics)
    if metric is not None:
        ar_texts = [tokenizer.decode(r.get("ar_token_ids", r["token_ids"]), skip_special_tokens=True) for r in rows]
        key = tuple((e.id, t) for e, t in zip(chosen, ar_texts))
        if key not in ar_scores:
            ar_scores[key] = metric_score(spec, metric, chosen, ar_texts)
        ar_value = ar_scores[key]
        quality[f"{metric}_ar"] = ar_value
        quality["task_drop"] = task_drop(metric, ar_value, quality.get(metric))
        # its standard error, paired and clustered by the task's groups (source files), as the fidelity's
        quality["task_drop_se"] = (None if run == "ar" else task_drop_standard_error(
            spec, metric, chosen, ar_texts, [r["text"] for r in rows], [spec.group(e) for e in chosen]))
    out = {**summary, "quality": quality, "task_metric": metric, "speed": run_speed(rows, [spec.group(e) for e in chosen])}
    write_json(eval_path(params, pair_name, task, run), out)
    return out


def run_speed(rows: list[dict], groups: list) -> dict:
    """A run's speed per prompt (`metrics.speed`): its decode seconds per generated token with the prompts' ids and
    source-file groups (so the report pairs any two runs), and its ratio over `ar` decoded beside it."""
    from ..metrics.speed import paired_ratio, seconds_per_token

    ours = [seconds_per_token(r["stats"]) for r in rows]
    ar = [seconds_per_token({"new_tokens": r.get("ar_new_tokens"), "decode_time_s": r.get("ar_decode_time_s"),
                             "wall_time_s": r.get("ar_wall_time_s")}) if "ar_new_tokens" in r else own
          for r, own in zip(rows, ours)]
    return {"ids": [r["id"] for r in rows], "groups": [str(g) for g in groups], "seconds_per_token": ours,
            "vs_ar": paired_ratio(ar, ours, groups)}


def evaluate_record(params: Params, pair_name: str, task: str, spec: RunSpec, out: dict) -> StageRecord:
    """One grid cell's evaluation as an MLflow run: the quality measures beside the decode's statistics."""
    pair = params.pair(pair_name)
    return StageRecord(
        "evaluate", f"evaluate/{pair.name}/{task}/{spec.name}",
        {"policy": out["policy"], "split": out["split"], "examples": out["examples"]},
        scalars(out) | {f"quality.{k}": v for k, v in out["quality"].items()}
        | {f"speed.vs_ar.{k}": v for k, v in (out["speed"]["vs_ar"] or {}).items() if v is not None}
        | {f"passes.{k}": v for k, v in out["passes"].items()}
        | {f"accepted_by_tier.{k}": out[k] for k in ("accepted_direct", "accepted_slim", "accepted_full",
                                                     "regenerated_slim", "rejected_full")},
        cell_tags(pair, task, spec), [eval_path(params, pair.name, task, spec.name)],
        datasets=task_split(params, task, out["split"]))
