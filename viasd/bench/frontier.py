"""`viasd bench --sweep frontier`: tokens/s against fidelity and against the task metric for `ar`, `sd`, `viasd`
over its tier thresholds (the rules' and the learned router's), the oracles and `spec_cascade` over its lenience,
timed side by side in one benchmark run.

Outputs: reports/bench/<pair>-<task>-sweep-frontier.{json,md,png}.
"""

from __future__ import annotations

from ..config import Params
from ..decoding.tier_router import floor_budget
from ..io import write_json, write_text
from ..study.cells import engine_options, fidelity_floor, tuned_settings
from ..study.paths import bench_paths
from .command import bench_prompts, run_setting, task_references
from .methods import method_table
from .timing import run_benchmark

# the speed-quality frontier: the tier thresholds of viasd and spec_cascade's lenience
FRONTIER_TAU_ACCEPT = {"ratio": (0.25, 0.5, 1.0, 2.0, 3.0), "prob": (0.2, 0.35, 0.5, 0.7, 0.9)}
FRONTIER_TAU_SLIM = (0.3, 0.5, 0.7, 0.9, float("inf"))
FRONTIER_ALPHA = (0.05, 0.1, 0.2, 0.3, 0.5)
# the learned router's two probability thresholds (P(draft right), P(slim right); inf: no regeneration)
FRONTIER_TAU_ROUTER = {"accept": (0.5, 0.7, 0.8, 0.9, 0.95), "slim": (0.5, 0.7, 0.9, float("inf"))}


def frontier_table(models, viasd: dict, gamma: int, max_new: int, cascade: dict, engine: dict,
                   oracle_budget: float | None = None) -> list:
    """`ar`, `sd`, the tuned `viasd` policy, a grid of `viasd` tier thresholds (the tuned rules, or the
    defaults when the tuned policy is tiers off; the draft gate off, so that every point shows what the
    tiers themselves trade), each with the lagged tokens checked by the full model (`verify_lagged`) and
    not (`unchecked`), with the learned router (when the pair has one) a grid of its two probability
    thresholds, the oracle router (and with `oracle_budget` the budgeted oracle at the fidelity floor), and
    of `spec_cascade` lenience, each a named benchmark method."""
    from dataclasses import replace

    from ..decoding.tier_router import oracle_settings
    from ..search.thresholds import PROBABILITY_SCORES
    from .methods import BenchMethod

    base = method_table(models, ["ar", "sd", "viasd", "spec_cascade"], gamma, max_new, None, cascade, engine)
    by_name = {m.name: m for m in base}
    # the grid varies the rules' thresholds: a learned router's tuned settings keep its gamma and engine only
    drop = {"tau_accept", "tau_slim", "router", *(("score", "confidence") if viasd.get("router") == "learned" else ())}
    tuned = {k: v for k, v in viasd.items() if k not in drop}
    if str(viasd.get("tau_accept")) == "inf" and str(viasd.get("tau_slim")) == "inf":  # tuned to SD: default rules
        tuned = {"gamma": viasd.get("gamma", gamma)}
    policy = replace(by_name["viasd"].policy, **{**tuned, "gate": 0.0})  # the gate off, whatever was tuned
    grid = FRONTIER_TAU_ACCEPT["prob" if policy.score in PROBABILITY_SCORES else "ratio"]
    table = [by_name["ar"], by_name["sd"], BenchMethod("viasd tuned", replace(by_name["viasd"].policy, **viasd))]
    table += [BenchMethod(f"viasd ta={ta:g} ts={ts:g}{'' if vl else ' unchecked'}",
                          replace(policy, tau_accept=ta, tau_slim=ts, verify_lagged=vl))
              for vl in (True, False) for ta in grid for ts in FRONTIER_TAU_SLIM]
    if models.router is not None:
        table += [BenchMethod(f"viasd router pa={ta:g} ps={ts:g}",
                              replace(policy, router="learned", tau_accept=ta, tau_slim=ts, verify_lagged=False))
                  for ta in FRONTIER_TAU_ROUTER["accept"] for ts in FRONTIER_TAU_ROUTER["slim"]]
    table.append(BenchMethod("viasd oracle", replace(policy, **oracle_settings(policy.gamma))))
    if oracle_budget is not None:
        table.append(BenchMethod("viasd oracle at floor", replace(policy, **oracle_settings(policy.gamma, oracle_budget))))
    table += [BenchMethod(f"spec_cascade a={a:g}", replace(by_name["spec_cascade"].policy, alpha=a))
              for a in FRONTIER_ALPHA]
    return table


def run_frontier(params: Params, pair: str, models, task: str, prompts: int, max_new_tokens: int | None,
                 repeats: int, gamma: int | None, progress: bool, engine: dict) -> dict:
    """Tokens/s against fidelity and against the task metric for `ar`, `sd`, `viasd` over its tier
    thresholds and `spec_cascade` over its lenience, all timed side by side in one benchmark run."""
    engine = engine_options(params, engine)
    gamma = gamma or params.decode.gamma
    max_new = max_new_tokens or params.max_new_tokens(task)
    cascade = params.decode.spec_cascade()
    table = frontier_table(models, tuned_settings(params, pair, task, required=False), gamma, max_new, cascade, engine,
                           floor_budget(fidelity_floor(params)))
    references, metric = task_references(params, task, prompts, max_new)
    res = run_benchmark(models, bench_prompts(params, models, task, prompts), table, max_new, repeats, progress,
                        references, metric)
    points = []
    for m in table:
        row = res["methods"][m.name]
        policy = m.policy
        points.append({"name": m.name, "method": policy.method, "router": policy.router,
                       "tokens_per_second": row.get("tokens_per_second_without_peek") or row["tokens_per_second"]["median"],
                       **row["quality"], "acceptance_rate": row["acceptance_rate"],
                       **{k: row.get(k) for k in ("block_escalation_rate", "gated_rate", "position_pass_rates",
                                                  "pass_cost_s", "position_escalation_rate", "slim_error_rate")},
                       "forward_passes_per_token": row["forward_passes_per_token"],
                       **({"tau_accept": policy.tau_accept, "tau_slim": policy.tau_slim, "score": policy.score,
                           "confidence": policy.confidence, "gamma": policy.gamma} if policy.method == "viasd" else {}),
                       **({"alpha": policy.alpha, "rule": policy.rule} if policy.method == "spec_cascade" else {})})
    out = {"pair": pair, "task": task, "sweep": "frontier", **engine, **run_setting(models), "prompts": prompts,
           "max_new_tokens": max_new, "gamma": gamma, "repeats": repeats, "task_metric": metric, "points": points,
           "numerical_ties": res["numerical_ties"]}
    paths = bench_paths(params, pair, task, "frontier", **engine, **run_setting(models))
    lines = [f"# {pair} on {task}: speed-quality frontier ({prompts} prompts x {max_new} tokens, {repeats} rounds)\n",
             f"| run | tokens/s | vs sd | fidelity | NLL | {metric or 'task metric'} | drop vs ar (points) | "
             "target passes/token | blocks escalated | tier pass rate by position |", "|---|---|---|---|---|---|---|---|---|---|"]
    sd_rate = next(p["tokens_per_second"] for p in points if p["name"] == "sd")

    def f(x, d=3):
        return "–" if x is None else f"{x:.{d}f}"

    for p in points:
        lines.append(f"| {p['name']} | {p['tokens_per_second']:.1f} | {p['tokens_per_second'] / sd_rate:.3f} | "
                     f"{f(p.get('fidelity'))} | {f(p.get('nll'))} | {f(p.get('task_score'), 2)} | "
                     f"{f(p.get('task_drop'), 2)} | {f(p['forward_passes_per_token'].get('target'))} | "
                     f"{f(p.get('block_escalation_rate'), 2)} | "
                     f"{' '.join(f(r, 2) for r in p.get('position_pass_rates') or []) or '–'} |")
    write_text(paths["md"], "\n".join(lines) + "\n")
    _frontier_plot(out, paths["png"])
    write_json(paths["json"], out)
    return {**out, "files": paths}


def _frontier_plot(out: dict, path) -> None:
    from ..io import pyplot, save_figure

    plt = pyplot()
    measures = [("fidelity", "fidelity (share of tokens = target's greedy choice)")]
    if out["task_metric"]:
        measures.append(("task_score", f"{out['task_metric']} against the reference"))
    fig, axes = plt.subplots(1, len(measures), figsize=(6 * len(measures), 4.5), squeeze=False)
    colours = {"ar": "black", "sd": "tab:green", "viasd": "tab:blue", "viasd router": "tab:purple",
               "viasd oracle (peeks not timed)": "tab:red", "spec_cascade": "tab:orange"}

    def kind(p):
        if p["method"] != "viasd" or p.get("router", "rules") == "rules":
            return p["method"]
        return "viasd router" if p["router"] == "learned" else "viasd oracle (peeks not timed)"

    for ax, (key, label) in zip(axes[0], measures):
        for method, colour in colours.items():
            pts = sorted((p[key], p["tokens_per_second"], p["name"]) for p in out["points"]
                         if kind(p) == method and p.get(key) is not None)
            if not pts:
                continue
            ax.scatter([x for x, _, _ in pts], [y for _, y, _ in pts], color=colour, s=24, label=method, zorder=3)
            for x, y, name in pts:
                if method not in ("ar", "sd"):
                    ax.annotate(name.split(" ", 1)[1], (x, y), textcoords="offset points", xytext=(3, 2), fontsize=6)
        ax.set_xlabel(label)
        ax.set_ylabel("tokens/s (median)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{out['pair']} on {out['task']}: speed vs quality, side by side", fontsize=10)
    save_figure(fig, path)
    plt.close(fig)
