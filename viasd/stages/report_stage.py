"""`viasd report`: the study's tables and plots from every evaluated run of the grid.

Outputs under reports/:
  tables/<pair>-<task>.md, .csv          run (method x ablation) x rejection rate, acceptance, mean
                                         accepted length, speedup vs ar, full passes per token, quality
  plots/<pair>-<task>-frontier.png       speedup vs quality
  plots/<pair>-<task>-tiers.png          how verified positions were settled, per run
  tables/<pair>-<task>-slims.md, .csv    the slim verifiers on the dev split, each with the thresholds
                                         tuned for it under the same quality constraint (DIMR vs baselines
                                         at equal quality)
  summary.md                             every table, with links to the plots (also those of dimr-search:
                                         reports/dimr/<pair>/search.png and layers.png)
"""

from __future__ import annotations

import csv
import io
import json

from ..config import Params
from ..io import write_text
from ..report_plots import frontier, tier_breakdown
from .decode_stage import StudyInputError
from .evaluate_stage import eval_path
from .runs import parse_run
from .slims import slims_to_tune
from .thresholds_stage import threshold_paths

COLUMNS = (("run", "run"), ("method", "method"), ("ablation", "ablation"), ("rejection_rate", "rejection rate"),
           ("acceptance_rate", "acceptance"), ("mean_accepted_length", "mean acc. length"),
           ("speedup_vs_ar", "speedup vs ar"), ("full_passes_per_token", "full passes/token"),
           ("block_escalation_rate", "block escalation"), ("tokens_per_second", "tokens/s"))


def grid(params: Params) -> list[tuple[str, str, str]]:
    """Every (pair, task, run) cell of the study."""
    s = params.study
    return [(p, t, parse_run(r).name) for p in s["pairs"] for t in s["tasks"] for r in s["runs"]]


def report_paths(params: Params) -> dict:
    base = params.reports_dir
    out = {"summary": base / "summary.md"}
    for pair in params.study["pairs"]:
        for task in params.study["tasks"]:
            key = f"{pair}-{task}"
            out[f"{key}.md"] = base / "tables" / f"{key}.md"
            out[f"{key}.csv"] = base / "tables" / f"{key}.csv"
            out[f"{key}-frontier"] = base / "plots" / f"{key}-frontier.png"
            out[f"{key}-tiers"] = base / "plots" / f"{key}-tiers.png"
            out[f"{key}-slims.md"] = base / "tables" / f"{key}-slims.md"
            out[f"{key}-slims.csv"] = base / "tables" / f"{key}-slims.csv"
    return out


SLIM_COLUMNS = (("slim", "slim"), ("layers", "kept layers"), ("gamma", "γ"), ("tau_accept", "τ_accept"),
                ("tau_slim", "τ_slim"), ("score", "score"), ("confidence", "confidence"),
                ("cost_ms_per_token", "cost ms/token (model)"), ("cost_vs_sd", "cost vs sd"),
                ("wall_ms_per_token", "wall ms/token"), ("rejection_rate", "rejection rate"),
                ("slim_passes_per_token", "slim passes/token"), ("full_passes_per_token", "full passes/token"),
                ("agreement", "agreement"))


def slim_rows(params: Params, pair: str, task: str) -> list[dict]:
    """One row per tuned slim: its thresholds and dev-split figures at the quality constraint."""
    rows = []
    for slim in slims_to_tune(params):
        path = threshold_paths(params, task, pair, slim)["json"]
        if not path.exists():
            raise StudyInputError(f"no tuned thresholds {path}: run `viasd tune-thresholds --pair {pair} "
                                  f"--task {task}` first")
        tuned = json.loads(path.read_text())
        layers = tuned["mask"]
        rows.append({"slim": slim, "layers": " ".join(map(str, layers)) if isinstance(layers, list) else layers,
                     **{k: tuned[k] for k in ("gamma", "tau_accept", "tau_slim", "score", "confidence", "cost_vs_sd")},
                     **{f"{k}_ms_per_token": 1000 * tuned["dev"][f"{k}_per_token"] for k in ("cost", "wall")},
                     **{k: tuned["dev"].get(k) for k in ("rejection_rate", "full_passes_per_token", "agreement")},
                     "slim_passes_per_token": (tuned["dev"].get("passes_per_token") or {}).get("slim")})
    return rows


def slim_table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(label for _, label in SLIM_COLUMNS) + " |", "|" + "---|" * len(SLIM_COLUMNS)]
    lines += ["| " + " | ".join(_fmt(r[k]) for k, _ in SLIM_COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def table_rows(evals: list[dict], quality_keys: list[str]) -> list[dict]:
    rows = []
    for e in evals:
        row = {key: e.get(key) for key, _ in COLUMNS}
        row.update({f"quality.{k}": e["quality"].get(k) for k in quality_keys})
        rows.append(row)
    return rows


def markdown_table(rows: list[dict], quality_keys: list[str]) -> str:
    heads = [label for _, label in COLUMNS] + quality_keys
    keys = [key for key, _ in COLUMNS] + [f"quality.{k}" for k in quality_keys]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(_fmt(r[k]) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def csv_table(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def run_report_stage(params: Params) -> dict:
    from ..tasks import get_task

    paths = report_paths(params)
    by_cell: dict[tuple[str, str], list[dict]] = {}
    for pair, task, run in grid(params):
        path = eval_path(params, pair, task, run)
        if not path.exists():
            raise StudyInputError(f"no evaluation {path}: run `viasd evaluate --pair {pair} --task {task} "
                                  f"--run {run}` first")
        by_cell.setdefault((pair, task), []).append(json.loads(path.read_text()))
    summary = [f"# viasd study `{params.study['name']}`\n",
               "Every run decodes the task's test prompts greedily; `speedup vs ar` is wall time of greedy `ar` "
               "over the run's, measured alternately in the same job; rejection rate = positions rejected by "
               "the full model / verified positions (DESIGN.md §2.6).\n"]
    headline = {}
    for (pair, task), evals in by_cell.items():
        key = f"{pair}-{task}"
        spec = get_task(task)
        quality_keys = [k for k in spec.metrics if any(k in e["quality"] for e in evals)]
        rows = table_rows(evals, quality_keys)
        table = markdown_table(rows, quality_keys)
        write_text(paths[f"{key}.md"], f"# {pair} on {task}\n\n{table}")
        write_text(paths[f"{key}.csv"], csv_table(rows))
        # the task's own metric on the frontier, unless it does not vary over the runs (e.g. pass@1 = 0)
        main_quality = next((k for k in quality_keys if k not in ("agreement", "nll")
                             and len({e["quality"].get(k) for e in evals}) > 1), "agreement")
        frontier(evals, main_quality, paths[f"{key}-frontier"], f"{pair} on {task}: speed vs {main_quality}")
        tier_breakdown(evals, paths[f"{key}-tiers"], f"{pair} on {task}: how verified positions were settled")
        slims = slim_rows(params, pair, task)
        slims_md = slim_table(slims)
        write_text(paths[f"{key}-slims.md"], f"# {pair} on {task}: slim verifiers on the dev split\n\n{slims_md}")
        write_text(paths[f"{key}-slims.csv"], csv_table(slims))
        summary += [f"## {pair} on {task}\n", table,
                    f"![frontier](plots/{key}-frontier.png) ![tiers](plots/{key}-tiers.png)\n",
                    f"Slim verifiers on the dev split, each with thresholds tuned for it (quality drop at most "
                    f"{params.raw['thresholds'].get('max_quality_drop')}); cost/token is the cost model of "
                    "DESIGN.md §2.4 with per-pass costs measured once (in the DIMR mask's search) and shared:\n", slims_md]
        headline[key] = {e["run"]: {"speedup_vs_ar": e.get("speedup_vs_ar"), "rejection_rate": e.get("rejection_rate")}
                         for e in evals}
    for pair in params.study["pairs"]:
        summary.append(f"DIMR search of `{pair}`: ![search](dimr/{pair}/search.png) ![layers](dimr/{pair}/layers.png)\n")
    write_text(paths["summary"], "\n".join(summary))
    return {"tables": len(by_cell), "runs": sum(len(v) for v in by_cell.values()), "headline": headline}
