"""The report's tables of a pair and task: one row per run of the grid (speed against SD at its best γ and
against `ar`, with intervals; the tier statistics; every quality measure), the slim verifiers on the dev split,
the slim tiers' pass rate per block position and the cost model's pass costs; markdown and CSV."""

from __future__ import annotations

import json

from ..config import Params
from ..errors import StudyInputError
from ..metrics.speed import describe, run_vs
from ..study.paths import threshold_paths
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


def fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def markdown(rows: list[dict], columns) -> str:
    """`rows` as a GitHub markdown table (pandas, through tabulate); `columns`: (key, heading) pairs, each
    value formatted by `fmt` (three decimals, `–` for none) and kept as written."""
    import pandas as pd

    frame = pd.DataFrame([[fmt(r.get(key)) for key, _ in columns] for r in rows], columns=[h for _, h in columns])
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
        policy = e.get("policy", {})
        gamma = None if e.get("method") == "ar" else policy.get("gamma")
        if e.get("method") == "cascade_sd" and gamma is not None:  # and its slim-level tokens per full pass
            gamma = f"{gamma} / {policy.get('gamma_slim') or 2 * gamma}"
        row.update(gamma=gamma, vs_sd_best_text=describe(e.get("vs_sd_best")),
                   vs_ar_text=describe(vs_ar))
        for name, ratio in (("vs_sd_best", e.get("vs_sd_best")), ("vs_ar", vs_ar)):
            row.update({f"{name}.{k}": (ratio or {}).get(k) for k in ("ratio", "low", "high")})
        row.update({f"quality.{k}": e["quality"].get(k) for k in quality_keys})
        rows.append(row)
    return rows


def markdown_table(rows: list[dict], quality_keys: list[str]) -> str:
    return markdown(rows, [*COLUMNS, *((f"quality.{k}", k) for k in quality_keys)])


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


def main_costs(params: Params, pair: str, task: str) -> dict | None:
    """The cost model of the DIMR slim's threshold search (None before it has run)."""
    from ..search.pass_cost import costs_from_json

    path = threshold_paths(params, task, pair, "main")["json"]
    return costs_from_json(json.loads(path.read_text()).get("pass_cost_model")) if path.exists() else None
