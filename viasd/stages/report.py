"""`viasd report`: the study's tables and plots from every evaluated run of the grid.

Outputs under reports/:
  tables/<pair>-<task>.md, .csv          run (method x ablation) x rejection rate, acceptance, mean
                                         accepted length, speedup vs ar, full passes per token, quality
  plots/<pair>-<task>-frontier.png       speedup vs each quality measure (fidelity, task metric, agreement)
  tables/<pair>-<task>-positions.md      VIA-SD runs: per block position, the share the slim tiers settled
  tables/<pair>-<task>-pass-costs.md     the cost model the threshold search used: per runner layout, its pass
                                         cost fitted as per_pass + per_token x width, and at the searched widths
  plots/<pair>-<task>-tiers.png          how verified positions were settled, per run
  tables/<pair>-<task>-slims.md, .csv    the slim verifiers on the dev split, each with the thresholds
                                         tuned for it under the same quality constraint (DIMR vs baselines
                                         at equal quality)
  tables/<pair>-family.md, .csv          the pair's models and slims: shape, parameters, training tokens and
                                         time, test NLL, teacher-forced greedy agreement with the target, DIMR cost
  tables/stage-times.md                  wall time per workflow rule, from Snakemake's benchmarks/ (when present)
  tables/claims.md                       the source's claims, each beside this study's test figure
  (summary.md also shows reports/batch/<pair>/<task>/: speed against batch size, `viasd batch-table`)
  metrics.json                           the headline per pair, task and run (speedup vs ar, rejection rate, the
                                         three quality measures): DVC's metrics file (`dvc metrics diff`,
                                         `dvc exp show` columns)
  plot-data/*.csv                        the series `dvc plots` draws: the frontier, the threshold and DIMR searches'
                                         trials, the training loss (`report.plot_data`)
  summary.md                             every table, with links to the plots (also those of dimr-search:
                                         reports/dimr/<pair>/search.png and layers.png)
"""

from __future__ import annotations

import json

from ..config import Params
from ..errors import StudyInputError
from ..io import write_json, write_text
from ..metrics.quality import QualityConstraints
from ..report.batch import batch_section
from ..report.claims import claim_rows, claims_section, dimr_seconds
from ..report.drafters import DRAFTERS, drafter_rows, drafters_section
from ..report.family import family_rows, family_table, router_summary
from ..report.headline import INTRO, headline
from ..report.headroom import oracle_headroom
from ..report.plot_data import write_plot_data
from ..report.plots import frontier, tier_breakdown
from ..report.stage_times import stage_times_section
from ..report.tables import (
    QUALITY_FIRST,
    csv_table,
    main_costs,
    markdown_table,
    pass_cost_table,
    position_table,
    shared_decodes,
    slim_rows,
    slim_table,
    table_rows,
    with_speed,
)
from ..study.paths import batch_table_paths, eval_path, report_paths, threshold_paths
from ..study.record import StageRecord
from ..study.runs import parse_run


def grid(params: Params) -> list[tuple[str, str, str]]:
    """Every (pair, task, run) cell of the study."""
    s = params.study
    return [(p, t, parse_run(r).name) for p in s.pairs for t in s.tasks for r in s.runs]


def drafter_searches(params: Params, pair: str, task: str) -> dict[str, dict | None]:
    """Each drafter's threshold search record for `pair` and `task` (`report.drafters`), None where it has not run."""
    out = {}
    for _, _, name in DRAFTERS.values():
        path = threshold_paths(params, task, pair, name)["json"]
        out[name] = json.loads(path.read_text()) if path.exists() else None
    return out


def batch_table(params: Params, pair: str, task: str) -> dict | None:
    """`viasd batch-table`'s result for `pair` and `task`, None where it has not run."""
    path = batch_table_paths(params, pair, task)["json"]
    return json.loads(path.read_text()) if path.exists() else None


def run_report_stage(params: Params) -> dict:

    paths = report_paths(params)
    by_cell: dict[tuple[str, str], list[dict]] = {}
    for pair, task, run in grid(params):
        path = eval_path(params, pair, task, run)
        if not path.exists():
            raise StudyInputError(f"no evaluation {path}: run `viasd evaluate --pair {pair} --task {task} "
                                  f"--run {run}` first")
        by_cell.setdefault((pair, task), []).append(json.loads(path.read_text()))
    summary = [f"# viasd study `{params.study.name}`\n", INTRO]
    figures: dict = {}
    claims: list[dict] = []
    for (pair, task), evals in by_cell.items():
        part, figures_of_task, task_claims = _task_part(params, paths, pair, task, evals)
        summary += part
        claims += task_claims
        figures.setdefault(pair, {})[task] = figures_of_task
    for pair in params.study.pairs:
        family = family_rows(params, pair)
        table = family_table(family)
        write_text(paths[f"{pair}-family.md"], f"# {pair}: models and slims\n\n{table}")
        write_text(paths[f"{pair}-family.csv"], csv_table(family))
        summary += [f"## The models and slims of `{pair}`\n",
                    "Agreement = share of positions of held-out text where the model's greedy token equals the "
                    "target's (teacher-forced); NLL − target's on the same tokens. What the tiers need: a slim "
                    "much closer to the target than the draft is.\n", table,
                    f"DIMR search of `{pair}`: ![search](dimr/{pair}/search.png) ![layers](dimr/{pair}/layers.png)\n",
                    router_summary(params, pair)]
    summary += claims_section(claims, paths["claims.md"])
    summary += stage_times_section(params, paths)
    write_json(paths["metrics"], figures)
    write_plot_data(params, by_cell)
    write_text(paths["summary"], "\n".join(summary))
    return {"tables": len(by_cell), "runs": sum(len(v) for v in by_cell.values()), "headline": figures}


def _task_part(params: Params, paths: dict, pair: str, task: str, evals: list[dict]) -> tuple[list[str], dict, list]:
    """One pair and task: write its tables and plots; returns its part of summary.md, its figures for metrics.json
    and its rows of the claims table."""
    from ..tasks import get_task

    key = f"{pair}-{task}"
    spec = get_task(task)
    metric = next((e.get("task_metric") for e in evals if e.get("task_metric")), None)
    listed = [*QUALITY_FIRST, *([metric, f"{metric}_ar"] if metric else []), *spec.metrics]
    quality_keys = [k for k in dict.fromkeys(listed) if any(k in e["quality"] for e in evals)]
    evals = with_speed(evals)
    claims = claim_rows(task if len(params.study.pairs) == 1 else f"{pair}: {task}", evals,
                         dimr_seconds(params.models_dir.parent / "benchmarks", pair))
    rows = table_rows(evals, quality_keys)
    table = markdown_table(rows, quality_keys)
    write_text(paths[f"{key}.md"], f"# {pair} on {task}\n\n{table}")
    write_text(paths[f"{key}.csv"], csv_table(rows))
    measures = [k for k in ("fidelity", metric, "agreement") if k and k in quality_keys]
    frontier(evals, measures, paths[f"{key}-frontier"], f"{pair} on {task}: speed vs quality")
    positions = position_table(evals)
    write_text(paths[f"{key}-positions.md"], f"# {pair} on {task}: slim-tier pass rate by block position\n\n"
                                             f"{positions}")
    tier_breakdown(evals, paths[f"{key}-tiers"], f"{pair} on {task}: how verified positions were settled")
    costs = pass_cost_table(params, pair, task)
    write_text(paths[f"{key}-pass-costs.md"], f"# {pair} on {task}: the cost model's pass costs\n\n{costs}")
    slims = slim_rows(params, pair, task)
    slims_md = slim_table(slims)
    write_text(paths[f"{key}-slims.md"], f"# {pair} on {task}: slim verifiers on the dev split\n\n{slims_md}")
    write_text(paths[f"{key}-slims.csv"], csv_table(slims))
    bounds = QualityConstraints.from_dict(params.thresholds.search.get("quality")).describe()
    part = [f"## {pair} on {task}\n", headline(evals, bounds),
            "Quality three ways: `fidelity` = share of tokens equal to the target's greedy choice given "
            "the generated prefix; `task_drop` = points of the task metric below `ar` on the same prompts "
            "(`task_drop_se` its standard error: paired, by the delete-one-file jackknife); "
            "`agreement` = positional equality with `ar`'s output.\n", table, shared_decodes(evals),
            f"![frontier](plots/{key}-frontier.png) ![tiers](plots/{key}-tiers.png)\n",
            "Slim-tier pass rate by block position (share of the positions the tiers examined that they "
            "settled without the full model; a block skips the full model only if every position passes):\n",
            positions, oracle_headroom(evals, main_costs(params, pair, task)),
            *drafters_section(drafter_rows(evals, drafter_searches(params, pair, task))),
            *batch_section(batch_table(params, pair, task), f"batch/{pair}/{task}/batch.png"),
            f"Slim verifiers on the dev split, each with thresholds tuned for it ({bounds}; tiers off = plain "
            "SD is always a candidate); cost/token is the cost model (draft, slim and full passes at "
            "per-pass costs measured once, in the DIMR mask's search, and shared) times the wall factor of "
            "its γ (the search's dev decodes' wall time over their modelled cost, prefill left out):\n",
            slims_md,
            "The cost model's pass costs (fitted per runner layout on probe decodes at every searched γ, "
            "the prompt's prefill left out; `target:12` is a full pass, `trunk:k` and `target:L-k` a pass "
            "split by reuse, `slim:0` the early exit's head; the draft feeds one token per pass, so its wider "
            "columns are the fit's extrapolation):\n", costs]
    figures = {
        e["run"]: {"gamma": e.get("policy", {}).get("gamma"), "vs_sd_best": e.get("vs_sd_best"),
                   "vs_ar": (e.get("speed") or {}).get("vs_ar"), "rejection_rate": e.get("rejection_rate"),
                   **{k: e["quality"].get(k) for k in QUALITY_FIRST}} for e in evals}
    return part, figures, claims


def report_record(params: Params, out: dict) -> StageRecord:
    """The report as an MLflow run: the study's grid, how many tables and runs, every file written."""
    metrics = {"tables": out["tables"], "runs": out["runs"]}
    for pair, tasks in out["headline"].items():  # the headline per pair and task, against SD at its best gamma
        for task, runs in tasks.items():
            for k, v in ((runs.get("viasd") or {}).get("vs_sd_best") or {}).items():
                if k in ("ratio", "low", "high") and v is not None:
                    metrics[f"{pair}.{task}.viasd_vs_sd_best.{k}"] = v
    return StageRecord("report", "report", {"study": params.study.as_dict()}, metrics, {},
                       list(report_paths(params).values()))
