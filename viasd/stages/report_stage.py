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
  metrics.json                           the headline per pair, task and run (speedup vs ar, rejection rate, the
                                         three quality measures): DVC's metrics file (`dvc metrics diff`,
                                         `dvc exp show` columns)
  summary.md                             every table, with links to the plots (also those of dimr-search:
                                         reports/dimr/<pair>/search.png and layers.png)
"""

from __future__ import annotations

import json
from pathlib import Path

from ..config import Params
from ..errors import StudyInputError
from ..io import write_json, write_text
from ..metrics.speed import describe, run_vs, within_noise
from ..report_headroom import oracle_headroom
from ..report_plots import frontier, tier_breakdown
from ..runs import parse_run
from ..study.paths import eval_path, mask_paths, report_paths, router_paths, threshold_paths
from ..study.record import StageRecord
from ..study.slims import slims_to_tune

COLUMNS = (("run", "run"), ("method", "method"), ("ablation", "ablation"), ("gamma", "γ"),
           ("vs_sd_best_text", "vs sd at best γ [95% CI]"), ("vs_ar_text", "vs ar [95% CI]"),
           ("rejection_rate", "rejection rate"), ("acceptance_rate", "acceptance"),
           ("mean_accepted_length", "mean acc. length"), ("full_passes_per_token", "full passes/token"),
           ("block_escalation_rate", "block escalation"), ("gated_rate", "gated blocks"),
           ("position_escalation_rate", "positions escalated"), ("slim_error_rate", "slim wrong (oracle)"),
           ("lagged_rolled_back", "rolled back"), ("tokens_per_second", "tokens/s"))
# the three quality measures, first in every table (docs/quality.md); the task's own metrics follow
QUALITY_FIRST = ("fidelity", "fidelity_se", "task_drop", "task_drop_se", "agreement")


def grid(params: Params) -> list[tuple[str, str, str]]:
    """Every (pair, task, run) cell of the study."""
    s = params.study
    return [(p, t, parse_run(r).name) for p in s.pairs for t in s.tasks for r in s.runs]


FAMILY_COLUMNS = (("model", "model"), ("shape", "layers × hidden"), ("parameters", "parameters"),
                  ("train_tokens", "training tokens"), ("train_seconds", "training s"),
                  ("steps_per_second", "training steps/s"), ("precision", "training precision"), ("test_nll", "test NLL"),
                  ("nll_vs_target", "NLL − target's"), ("agreement", "greedy agreement with target"),
                  ("dimr_cost", "DIMR cost"))


def family_rows(params: Params, pair: str) -> list[dict]:
    """The pair's models (training reports of the trained family) and slims (kept layers, DIMR cost),
    each with its teacher-forced greedy agreement with the target (measured by `viasd dimr-search`)."""

    spec = params.pair(pair)
    paths = mask_paths(params, pair)
    if not paths["mask"].exists():
        raise StudyInputError(f"no DIMR mask {paths['mask']}: run `viasd dimr-search --pair {pair}` first")
    mask = json.loads(paths["mask"].read_text())
    agreement = mask.get("agreement") or {}  # keyed by role, "slim" and baseline name
    base = (agreement.get("target") or {}).get("nll")

    def row(label: str, key: str, **fields) -> dict:
        measured = agreement.get(key) or {}
        nll = measured.get("nll")
        return {"model": label, **dict.fromkeys(("shape", "parameters", "train_tokens", "train_seconds",
                                                 "steps_per_second", "precision", "test_nll", "dimr_cost")), **fields,
                "agreement": measured.get("agreement"),
                "nll_vs_target": None if nll is None or base is None else round(nll - base, 4)}

    rows = []
    for role in ("target", "draft", "independent"):
        source = getattr(spec, role)
        if source is None:
            continue
        fields = {}
        if (Path(source) / "training.json").exists():
            t = json.loads((Path(source) / "training.json").read_text())
            fields = {"parameters": t["parameters"], "train_tokens": t["tokens"], "train_seconds": t["train_seconds"],
                      "steps_per_second": round(t["steps"] / t["train_seconds"], 2) if t["train_seconds"] else None,
                      "precision": t.get("precision", "float32"), "test_nll": t["test_nll"]}
        if (Path(source) / "config.json").exists():
            c = json.loads((Path(source) / "config.json").read_text())
            if c.get("is_encoder_decoder"):  # T5: num_decoder_layers, d_model; BART: decoder_layers, d_model
                depth = c.get("num_decoder_layers") or c.get("decoder_layers")
                fields["shape"] = f"decoder {depth} × {c.get('d_model')}"
            else:
                fields["shape"] = f"{c.get('num_hidden_layers')} × {c.get('hidden_size')}"
        rows.append(row(role, role, **fields))
    n = mask.get("num_layers")
    slims = [("DIMR", "slim", mask)] + [(b, b, json.loads(paths[b].read_text()))
                                         for b in ("random", "truncate", "every_other") if paths[b].exists()]
    for label, key, m in slims:
        rows.append(row(f"slim ({label})", key, dimr_cost=m.get("cost"),
                        shape=f"{len(m['keep_layers'])} of {n}: {' '.join(map(str, m['keep_layers']))}"))
    return rows


def family_table(rows: list[dict]) -> str:
    return markdown(rows, FAMILY_COLUMNS)


def stage_times(benchmarks: Path) -> str | None:
    """Wall time per rule (sum and count of its jobs) from Snakemake's `benchmark:` files, or None."""
    files = sorted(benchmarks.rglob("*.tsv")) if benchmarks.is_dir() else []
    totals: dict[str, list[float]] = {}
    import pandas as pd

    for f in files:
        bench = pd.read_csv(f, sep="\t")
        if len(bench) and "s" in bench.columns:
            rule = f.relative_to(benchmarks).parts[0].removesuffix(".tsv")
            totals.setdefault(rule, []).append(float(bench["s"].iloc[-1]))
    if not totals:
        return None
    rows = [{"rule": rule, "jobs": len(secs), "sum": f"{sum(secs):.0f}", "longest": f"{max(secs):.0f}"}
            for rule, secs in sorted(totals.items(), key=lambda kv: -sum(kv[1]))]
    rows.append({"rule": "all", "jobs": sum(map(len, totals.values())), "sum": f"{sum(map(sum, totals.values())):.0f}",
                 "longest": ""})
    return markdown(rows, (("rule", "rule"), ("jobs", "jobs"), ("sum", "wall s (sum)"), ("longest", "longest job s")))


SLIM_COLUMNS = (("slim", "slim"), ("layers", "kept layers"), ("tiers_off", "tiers off (= SD)"), ("gamma", "γ"),
                ("tau_accept", "τ_accept"), ("tau_slim", "τ_slim"), ("score", "score"), ("confidence", "confidence"),
                ("gate", "gate"), ("max_lag", "max lag"), ("verify_lagged", "verify lagged"),
                ("cost_ms_per_token", "cost ms/token (calibrated)"), ("wall_factor", "wall factor"), ("cost_vs_sd", "cost vs sd"),
                ("wall_ms_per_token", "wall ms/token"), ("rejection_rate", "rejection rate"),
                ("slim_passes_per_token", "slim passes/token"), ("full_passes_per_token", "full passes/token"),
                ("fidelity", "fidelity"), ("fidelity_lower_bound", "fidelity lower bound"),
                ("task_drop", "task drop (points)"), ("task_drop_se", "task drop SE"), ("agreement", "agreement"),
                ("confirm_fidelity", "held-out fidelity"), ("confirm_task_drop", "held-out task drop"),
                ("confirm_task_drop_se", "held-out task drop SE"),
                ("confirm_checks", "held-out checks (rejected)"))


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
                     **{k: tuned.get(k) for k in ("tiers_off", "gamma", "tau_accept", "tau_slim", "score", "confidence",
                                                  "gate", "max_lag", "verify_lagged", "cost_vs_sd")},
                     **{f"{k}_ms_per_token": 1000 * tuned["dev"][f"{k}_per_token"] for k in ("cost", "wall")},
                     "wall_factor": tuned["wall_factors"][str(tuned["gamma"])],
                     **{k: tuned["dev"].get(k) for k in ("rejection_rate", "full_passes_per_token", "fidelity",
                                                         "fidelity_lower_bound", "task_drop", "task_drop_se",
                                                         "agreement")},
                     "slim_passes_per_token": sum(v for k, v in (tuned["dev"].get("passes_per_token") or {}).items()
                                                  if k.split(":")[0] == "slim"),
                     **confirm_columns(tuned.get("confirm"))})
    return rows


def confirm_columns(confirm: dict | None) -> dict:
    """The held-out confirmation of a tuned policy: the kept policy's fidelity and task drop on the held-out
    dev prompts and how many candidates were checked (rejected ones in brackets); empty when SD won on dev."""
    checks = (confirm or {}).get("checks") or []
    if not checks:
        return {}
    kept = checks[-1] if checks[-1]["feasible"] else None
    return {"confirm_fidelity": kept["fidelity"] if kept else None, "confirm_task_drop": kept["task_drop"] if kept else None,
            "confirm_task_drop_se": kept.get("task_drop_se") if kept else None,
            "confirm_checks": f"{len(checks)} ({sum(not c['feasible'] for c in checks)})"}


def slim_table(rows: list[dict]) -> str:
    return markdown(rows, SLIM_COLUMNS)


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def markdown(rows: list[dict], columns) -> str:
    """`rows` as a GitHub markdown table (pandas, through tabulate); `columns`: (key, heading) pairs, each
    value formatted by `_fmt` (three decimals, `–` for none) and kept as written."""
    import pandas as pd

    frame = pd.DataFrame([[_fmt(r.get(key)) for key, _ in columns] for r in rows], columns=[h for _, h in columns])
    return frame.to_markdown(index=False, tablefmt="github", disable_numparse=True) + "\n"


def with_speed(evals: list[dict]) -> list[dict]:
    """Each evaluated run with `vs_sd_best`: its paired speed ratio over the `sd` run (SD at its best gamma on
    dev) on the same prompts, with the 95 % interval clustered by source file (`metrics.speed`)."""
    sd = next((e.get("speed") for e in evals if e["run"] == "sd"), None)
    return [{**e, "vs_sd_best": run_vs(sd, e.get("speed"))} for e in evals]


def table_rows(evals: list[dict], quality_keys: list[str]) -> list[dict]:
    """One row per run: the columns of `COLUMNS` (speed ratios as `1.234× [low, high]`), the ratios' numbers
    (for the CSV) and the quality measures."""
    rows = []
    for e in evals:
        vs_ar = (e.get("speed") or {}).get("vs_ar")
        row = {key: e.get(key) for key, _ in COLUMNS}
        gamma = None if e.get("method") == "ar" else e.get("policy", {}).get("gamma")
        row.update(gamma=gamma, vs_sd_best_text=describe(e.get("vs_sd_best")),
                   vs_ar_text=describe(vs_ar))
        for name, ratio in (("vs_sd_best", e.get("vs_sd_best")), ("vs_ar", vs_ar)):
            row.update({f"{name}.{k}": (ratio or {}).get(k) for k in ("ratio", "low", "high")})
        row.update({f"quality.{k}": e["quality"].get(k) for k in quality_keys})
        rows.append(row)
    return rows


def markdown_table(rows: list[dict], quality_keys: list[str]) -> str:
    return markdown(rows, [*COLUMNS, *((f"quality.{k}", k) for k in quality_keys)])


def headline(evals: list[dict], bounds: str) -> str:
    """The task's headline: the tuned `viasd` against SD at its own best gamma (chosen on dev), its interval and
    whether the difference is inside the noise, every quality measure beside it; then SD at each gamma on
    these test prompts against the dev choice, and which runs' differences from `sd` the intervals cannot
    tell apart."""
    by_run = {e["run"]: e for e in evals}
    if "sd" not in by_run:
        return ""
    sd_gamma = by_run["sd"]["policy"].get("gamma")
    lines = []
    if "viasd" in by_run:
        v = by_run["viasd"]
        q = v["quality"]
        noise = within_noise(v.get("vs_sd_best"))
        lines.append(
            f"**`viasd` (γ {v['policy'].get('gamma')}) against `sd` at its best γ on dev (γ {sd_gamma}): "
            f"{describe(v.get('vs_sd_best'))}** over {(v.get('vs_sd_best') or {}).get('prompts', 0)} test prompts from "
            f"{(v.get('vs_sd_best') or {}).get('groups', 0)} source files; fidelity {_fmt(q.get('fidelity'))} "
            f"(SE {_fmt(q.get('fidelity_se'))}), task drop {_fmt(q.get('task_drop'))} (SE {_fmt(q.get('task_drop_se'))}), "
            f"agreement {_fmt(q.get('agreement'))}; the search's bars: {bounds}. "
            + ("The interval holds 1: the difference is inside the noise." if noise else
               "The interval excludes 1." if noise is not None else "No interval (fewer than two source files)."))
    fixed = [e for e in evals if e["method"] == "sd" and e["run"] != "sd"]
    if fixed:
        lines.append("SD at each γ on these prompts against the dev choice (read, not chosen on: the dev search "
                     "picked γ " + str(sd_gamma) + "): " + ", ".join(
                         f"`{e['run']}` {describe(e.get('vs_sd_best'))}" for e in fixed) + ".")
    inside = [e["run"] for e in evals if e["run"] != "sd" and within_noise(e.get("vs_sd_best"))]
    if inside:
        lines.append("Runs whose speed the 95 % interval cannot tell from `sd`'s: " + ", ".join(f"`{r}`" for r in inside)
                     + ".")
    return "\n\n".join(lines) + "\n"


def csv_table(rows: list[dict]) -> str:
    import pandas as pd

    return pd.DataFrame(rows).to_csv(index=False, lineterminator="\n")


def position_table(evals: list[dict]) -> str:
    """Per VIA-SD run: the slim tiers' pass rate at each block position (settled / examined)."""
    rows = [e for e in evals if e.get("method") == "viasd" and e.get("position_reached")]
    if not rows:
        return "No VIA-SD run examined a position with the slim tiers (all blocks gated or tiers off).\n"
    width = max(len(e["position_reached"]) for e in rows)
    table = []
    for e in rows:
        reached, settled = e["position_reached"], e["position_settled"]
        table.append({"run": e["run"], "gated": e.get("gated_rate"), "escalated": e.get("block_escalation_rate"),
                      **{i: f"{settled[i] / reached[i]:.2f} ({reached[i]})" if i < len(reached) and reached[i] else None
                         for i in range(width)}})
    return markdown(table, [("run", "run"), *((i, f"pos {i + 1}") for i in range(width)), ("gated", "blocks gated"),
                            ("escalated", "escalated")])


def pass_cost_table(params: Params, pair: str, task: str) -> str:
    """The DIMR slim's search's cost model: per runner layout (`draft:1`, `target:12` a full pass, `trunk:k`,
    `target:L-k` and `slim:0` the passes split by reuse), the fitted `per_pass` and `per_token` and the
    cost of a pass at each searched block width (gamma + 1 tokens), in ms; the last column divides a
    layout's cost at the tuned gamma by the full pass's at the same width."""
    from ..search.pass_cost import costs_from_json, full_layout

    tuned = json.loads(threshold_paths(params, task, pair, "main")["json"].read_text())
    costs = costs_from_json(tuned.get("pass_cost_model")) or {}
    gammas = tuned["signature"]["config"]["gamma"]
    full, w = full_layout(costs), tuned["gamma"] + 1
    rows = [{"layout": layout, "per_pass": 1000 * c.per_pass, "per_token": 1000 * c.per_token,
             **{f"w{g + 1}": 1000 * c(g + 1) for g in gammas}, "vs_full": c(w) / costs[full](w) if full else None}
            for layout, c in sorted(costs.items(), key=lambda kv: -kv[1](1))]
    return markdown(rows, [("layout", "runner layout"), ("per_pass", "ms per pass"), ("per_token", "ms per token fed"),
                           *((f"w{g + 1}", f"{g + 1} tokens (γ {g}), ms") for g in gammas),
                           ("vs_full", f"vs a full pass at γ {tuned['gamma']}")])


def shared_decodes(evals: list[dict]) -> str:
    """One line naming the runs that took another run's decode (`same_decode_as`), or nothing."""
    same: dict[str, list[str]] = {}
    for e in evals:
        if e.get("same_decode_as"):
            same.setdefault(e["same_decode_as"], []).append(e["run"])
    if not same:
        return ""
    parts = "; ".join(f"{', '.join(f'`{r}`' for r in runs)} as `{source}`" for source, runs in same.items())
    return (f"Decoded once for several runs (the same policy and slim, or every tier off, where no slim pass runs), "
            f"so their rows and times are one measurement: {parts}.\n")


def router_summary(params: Params, pair: str) -> str:
    """The pair's learned router: held-out AUC and ECE of both heads, and its reliability plot."""
    path = router_paths(params, pair)["router"]
    if not path.exists():
        return f"`{pair}` has no learned router (`viasd train-router`).\n"
    info = json.loads(path.read_text())["info"]

    def head(name):
        h = info[name]
        auc = "–" if h["auc"] is None else f"{h['auc']:.3f}"
        ece = "–" if h["ece"] is None else f"{h['ece']:.3f}"
        return f"P({name} right): held-out AUC {auc}, ECE {ece} (base rate {h['base_rate']:.3f})"

    return (f"The learned router of `{pair}` ({info['rows']} rows from {info['decodes']} oracle decodes of the "
            f"calibration set, {info['heldout_rows']} held out; probe after layer {info['probe_layers'] - 1}): "
            f"{head('draft')}; {head('slim')}. ![reliability](router/{pair}/reliability.png)\n"
            if info.get("probe_layers") else
            f"The learned router of `{pair}` ({info['rows']} rows, {info['heldout_rows']} held out, no probe): "
            f"{head('draft')}; {head('slim')}. ![reliability](router/{pair}/reliability.png)\n")


def main_costs(params: Params, pair: str, task: str) -> dict | None:
    """The cost model of the DIMR slim's threshold search (None before it has run)."""
    from ..search.pass_cost import costs_from_json

    path = threshold_paths(params, task, pair, "main")["json"]
    return costs_from_json(json.loads(path.read_text()).get("pass_cost_model")) if path.exists() else None


INTRO = ("Every run decodes the task's test prompts greedily, each prompt by every run in turn in a balanced order. "
         "Speed is decode time per generated token (the prompt's prefill timed apart); a ratio is the geometric mean "
         "of the per-prompt paired ratios, with a 95 % interval clustered by source file. `sd` runs at the γ its own "
         "dev search found cheapest (`sd-gamma_k`: SD at a fixed γ); every `vs sd` is against it. Rejection rate = "
         "positions rejected by the full model / verified positions (docs/method.md (statistics)). The test split "
         "is read to report: no choice is made on it.\n")


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
    summary = [f"# viasd study `{params.study.name}`\n", INTRO]
    figures: dict = {}
    for (pair, task), evals in by_cell.items():
        key = f"{pair}-{task}"
        spec = get_task(task)
        metric = next((e.get("task_metric") for e in evals if e.get("task_metric")), None)
        listed = [*QUALITY_FIRST, *([metric, f"{metric}_ar"] if metric else []), *spec.metrics]
        quality_keys = [k for k in dict.fromkeys(listed) if any(k in e["quality"] for e in evals)]
        evals = with_speed(evals)
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
        from ..metrics.quality import QualityConstraints

        bounds = QualityConstraints.from_dict(params.thresholds.search.get("quality")).describe()
        summary += [f"## {pair} on {task}\n", headline(evals, bounds),
                    "Quality three ways: `fidelity` = share of tokens equal to the target's greedy choice given "
                    "the generated prefix; `task_drop` = points of the task metric below `ar` on the same prompts "
                    "(`task_drop_se` its standard error: paired, by the delete-one-file jackknife); "
                    "`agreement` = positional equality with `ar`'s output.\n", table, shared_decodes(evals),
                    f"![frontier](plots/{key}-frontier.png) ![tiers](plots/{key}-tiers.png)\n",
                    "Slim-tier pass rate by block position (share of the positions the tiers examined that they "
                    "settled without the full model; a block skips the full model only if every position passes):\n",
                    positions, oracle_headroom(evals, main_costs(params, pair, task)),
                    f"Slim verifiers on the dev split, each with thresholds tuned for it ({bounds}; tiers off = plain "
                    "SD is always a candidate); cost/token is the cost model (draft, slim and full passes at "
                    "per-pass costs measured once, in the DIMR mask's search, and shared) times the wall factor of "
                    "its γ (the search's dev decodes' wall time over their modelled cost, prefill left out):\n",
                    slims_md,
                    "The cost model's pass costs (fitted per runner layout on probe decodes at every searched γ, "
                    "the prompt's prefill left out; `target:12` is a full pass, `trunk:k` and `target:L-k` a pass "
                    "split by reuse, `slim:0` the early exit's head; the draft feeds one token per pass, so its wider "
                    "columns are the fit's extrapolation):\n", costs]
        figures.setdefault(pair, {})[task] = {
            e["run"]: {"gamma": e.get("policy", {}).get("gamma"), "vs_sd_best": e.get("vs_sd_best"),
                       "vs_ar": (e.get("speed") or {}).get("vs_ar"), "rejection_rate": e.get("rejection_rate"),
                       **{k: e["quality"].get(k) for k in QUALITY_FIRST}} for e in evals}
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
    summary += stage_times_section(params, paths)
    write_json(paths["metrics"], figures)
    write_text(paths["summary"], "\n".join(summary))
    return {"tables": len(by_cell), "runs": sum(len(v) for v in by_cell.values()), "headline": figures}


def stage_times_section(params: Params, paths: dict) -> list[str]:
    """The stage-times table (written to its own file) and its summary section; empty without benchmarks."""
    times = stage_times(params.models_dir.parent / "benchmarks")
    if not times:
        return []
    side_by_side = "Jobs whose threads fit in `--cores` run side by side, so the sums can exceed the study's wall time."
    write_text(paths["stage-times"], f"# Wall time per workflow rule (Snakemake benchmarks/)\n\n{side_by_side}\n\n{times}")
    return ["## Stage times\n", "Wall time per workflow rule, from Snakemake's `benchmarks/` (the report's own job is "
            f"not yet in it). {side_by_side} Machines of one kind differ in speed from day to day: the family table's "
            "training steps/s (the target's above all) is this run's gauge.\n", times]


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
