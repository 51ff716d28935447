"""`viasd bench`: the benchmark on a pair and task of the study, and its sweeps.

Outputs: reports/bench/<pair>-<task>.json (+ .md), and per sweep <pair>-<task>-sweep-<kind>.json,
.md and .png (tokens/s and peak memory against gamma, generated length or prompt length).
"""

from __future__ import annotations

import logging

from ..config import Params
from ..decoding.policy import METHODS
from ..decoding.tier_router import floor_budget
from ..io import write_json, write_text
from ..study.cells import engine_options, fidelity_floor, tuned_settings
from ..study.paths import bench_paths, mask_paths, router_paths, threshold_paths
from ..study.record import StageRecord
from .figures import markdown
from .timing import (
    HF,
    VIASD_VARIANTS,
    BenchError,
    early_exit_layers,
    method_table,
    per_token_seconds,
    run_benchmark,
)

log = logging.getLogger(__name__)
SWEEPS = ("gamma", "length", "prompt", "position", "frontier")
# the speed-quality frontier (`--sweep frontier`): the tier thresholds of viasd and spec_cascade's lenience
FRONTIER_TAU_ACCEPT = {"ratio": (0.25, 0.5, 1.0, 2.0, 3.0), "prob": (0.2, 0.35, 0.5, 0.7, 0.9)}
FRONTIER_TAU_SLIM = (0.3, 0.5, 0.7, 0.9, float("inf"))
FRONTIER_ALPHA = (0.05, 0.1, 0.2, 0.3, 0.5)
# the learned router's two probability thresholds (P(draft right), P(slim right); inf: no regeneration)
FRONTIER_TAU_ROUTER = {"accept": (0.5, 0.7, 0.8, 0.9, 0.95), "slim": (0.5, 0.7, 0.9, float("inf"))}
SWEEP_METHODS = ["hf_ar", "ar", "sd", "viasd"]


def run_setting(models) -> dict:
    """The loaded models' device type and dtype name, as `bench_paths` takes them."""
    first = next(models.target.parameters())
    return {"device": first.device.type, "dtype": str(first.dtype).removeprefix("torch.")}


def load_bench_models(params: Params, pair_name: str | None, device: str, dtype: str):
    """The pair, with its DIMR mask as slim verifier when the search has run, its learned router when
    `viasd train-router` has fitted one, and the family's feature drafter when `viasd train-drafter` has trained it."""
    from ..models import load_models
    from ..training.tier_router import load_router

    pair = params.pair(pair_name)
    mask = mask_paths(params, pair.name)["mask"]
    models = load_models(pair.target, draft=pair.draft, masks=[mask] if mask.exists() else [], device=device,
                         dtype=dtype if dtype != "auto" else pair.dtype, trust_remote_code=pair.trust_remote_code)
    router = router_paths(params, pair.name)["router"]
    if router.exists():
        models.router = load_router(router)
    drafter = params.model_dir("feature_drafter") if pair.trained else None
    if drafter is not None and drafter.exists():  # the family's feature drafter (`viasd train-drafter`)
        from ..decoding.feature_drafter import load_feature_drafter

        models.feature_drafter = load_feature_drafter(drafter, models.target)
        feature_router = router_paths(params, pair.name, "feature")["router"]
        if feature_router.exists():  # refitted on the feature drafter's blocks (a viasd-drafter_feature run)
            models.feature_router = load_router(feature_router)
    return pair, models


def bench_prompts(params: Params, models, task: str, n: int, length: int | None = None) -> list[list[int]]:
    """`n` prompts of the task's test split, token ids from the benchmarked pair's tokenizer (or the
    stored ids of prompts cut from a token stream); with `length`, windows of that many tokens from the
    test corpus instead (the prompt-length sweep)."""
    from ..tasks import load_examples

    if length is None:
        examples = load_examples(params.data.dir, task, "test")[:n]
        return [e.prompt_ids if e.prompt_ids is not None else models.encode(e.prompt) for e in examples]
    import pyarrow.parquet as pq

    path = params.data.dir / "corpus" / "test.parquet"
    if not path.exists():
        raise BenchError(f"no test corpus at {path}: run `viasd prepare-data` first")
    files = [ids for ids in pq.read_table(path).column("input_ids").to_pylist() if len(ids) > length]
    if not files:
        raise BenchError(f"no test file has more than {length} tokens for the prompt-length sweep")
    return [files[i % len(files)][:length] for i in range(n)]


def bench_gamma(params: Params, pair: str, task: str, gamma: int | None) -> tuple[int, str]:
    """The gamma of the bench's lossless baselines (`sd`, `cascade_sd`, transformers' fixed-length assisted
    generation) and where it comes from: `--gamma`; else SD's best gamma on dev (the DIMR slim's threshold
    search, with `decode.sd_gamma: best`) when the search has run; else `decode.sd_gamma` or `decode.gamma`."""
    from ..study.cells import sd_best_gamma

    if gamma:
        return gamma, "--gamma"
    if params.decode.sd_gamma == "best":
        if threshold_paths(params, task, pair, "main")["json"].exists():
            return sd_best_gamma(params, pair, task), "SD's best on dev"
        log.warning("no threshold search for %s on %s: sd runs at decode.gamma %d, not at its best gamma on dev",
                    pair, task, params.decode.gamma)
        return params.decode.gamma, "decode.gamma (no threshold search yet)"
    return int(params.decode.sd_gamma), "decode.sd_gamma"


def baseline_settings(params: Params, pair: str, task: str) -> dict[str, dict]:
    """self_sd's and cascade_sd's own best settings on dev, where the DIMR slim's threshold search measured them
    (the study's grid has those runs): {method: DecodePolicy fields}. A baseline the search did not measure runs at
    SD's best gamma, as `sd` (logged)."""
    from ..study.cells import best_key, best_settings
    from ..study.slims import read_json

    found = read_json(threshold_paths(params, task, pair, "main")["json"], "the tuned thresholds")
    out = {}
    for method in ("self_sd", "cascade_sd"):
        if best_key(params, method) in found:
            out[method] = best_settings(params, pair, task, method)
        else:
            log.info("%s runs at SD's best gamma: the threshold search did not measure its own (no %s run in "
                     "study.runs)", method, method)
    return out


def bench_groups(params: Params, task: str, n: int) -> list[str]:
    """The source-file group of each of the first `n` test prompts (the speed intervals' clusters)."""
    from ..tasks import get_task, load_examples

    spec = get_task(task)
    return [str(spec.group(e)) for e in load_examples(params.data.dir, task, "test")[:n]]


def task_references(params: Params, task: str, n: int, max_new: int) -> tuple[list[str] | None, str | None]:
    """The references of the first `n` test prompts and the task's main metric, for quality beside speed
    (None when the task has no text metric)."""
    from ..metrics.quality import main_metric
    from ..tasks import get_task, load_examples

    metric = main_metric(get_task(task).metrics)
    if metric is None or metric == "pass_at_1":  # pass@1 needs the task's tests and stop rules: see the study
        return None, None
    return [e.reference for e in load_examples(params.data.dir, task, "test")[:n]], metric


def default_methods(params: Params) -> list[str]:
    """Every benchmark method; the budgeted oracle only where the search has a fidelity floor below 1."""
    budget = floor_budget(fidelity_floor(params))
    return [m for m in HF + METHODS + VIASD_VARIANTS if m != "viasd-oracle_budget" or budget is not None]


def _prefix_slim(models) -> bool:
    """The pair's slim keeps only a prefix of the target's layers (an early exit transformers can draft with)."""
    try:
        early_exit_layers(models)
    except BenchError:
        return False
    return True


def run_bench_stage(params: Params, pair_name: str | None, task: str, methods: list[str], prompts: int,
                    max_new_tokens: int | None, repeats: int, gamma: int | None, device: str, dtype: str,
                    progress: bool = True, engine: dict | None = None) -> dict:
    pair, models = load_bench_models(params, pair_name, device, dtype)
    if "hf_early_exit" in methods and methods == default_methods(params) and not _prefix_slim(models):
        log.info("hf_early_exit left out: the pair's slim does not keep a prefix of the target's layers")
        methods = [m for m in methods if m != "hf_early_exit"]
    engine = engine_options(params, engine)
    gamma, source = bench_gamma(params, pair.name, task, gamma)
    max_new = max_new_tokens or params.max_new_tokens(task)
    cascade = params.decode.spec_cascade()
    rules = threshold_paths(params, task, pair.name, "rules")["json"]
    methods = [m for m in methods if m != "viasd-rules" or rules.exists()]  # the rules' own search, when it ran
    variants = {"viasd-rules": tuned_settings(params, pair.name, task, "rules", required=False)} if rules.exists() else {}
    if threshold_paths(params, task, pair.name, "drafter_feature")["json"].exists():  # its own search, when it ran
        variants["viasd-drafter_feature"] = tuned_settings(params, pair.name, task, "drafter_feature")
    tuned = tuned_settings(params, pair.name, task, required=False)
    own = baseline_settings(params, pair.name, task) if source == "SD's best on dev" else {}
    table = method_table(models, methods, gamma, max_new, tuned, cascade, engine, variants,
                         floor_budget(fidelity_floor(params)), own)
    references, metric = task_references(params, task, prompts, max_new)
    result = run_benchmark(models, bench_prompts(params, models, task, prompts), table, max_new, repeats, progress,
                           references, metric, bench_groups(params, task, prompts))
    weight = next(models.target.parameters())
    result.update({"pair": pair.name, "task": task, "prompts": prompts, "max_new_tokens": max_new, "gamma": gamma,
                   "gamma_source": source, "baseline_settings": {m: v for m, v in own.items() if m in methods},
                   "repeats": repeats, **engine, "device": str(weight.device), "dtype": str(weight.dtype), "slim_layers": (
                       list(models.slims[0].mask.keep_layers) if models.slims else None)})
    paths = bench_paths(params, pair.name, task, **engine, **run_setting(models))
    write_text(paths["md"], markdown(result, f"viasd bench: {pair.name} on {task}, {prompts} prompts x {max_new} "
                                              f"tokens, sd at gamma {gamma} ({source}), {result['device']}, "
                                              f"{result['dtype']}"))
    write_json(paths["json"], result)
    return {**result, "files": paths}


def _best(key: str, result: dict) -> str:
    """An interval ratio's name, `_vs_sd` spelt `_vs_sd_best` where sd ran at its best gamma on dev."""
    return key.replace("_vs_sd", "_vs_sd_best") if key.endswith("_vs_sd") and result.get("gamma_source") == \
        "SD's best on dev" else key


def bench_record(result: dict) -> StageRecord:
    """A benchmark as an MLflow run: its settings, every ratio, speed, efficiency and quality measure."""
    methods = result["methods"]
    return StageRecord(
        "bench", f"bench/{result['pair']}/{result['task']}",
        {k: result[k] for k in ("prompts", "max_new_tokens", "gamma", "repeats", "device", "dtype", "cache", "compile",
                                "reuse")},
        {f"ratio.{k}": v for k, v in result["ratios"].items()}
        | {f"ratio.{k}.round_{end}": v[end] for k, v in result.get("ratio_rounds", {}).items() for end in ("min", "max")}
        | {f"interval.{_best(k, result)}.{end}": v[end] for k, v in result.get("intervals", {}).items() if v
           for end in ("ratio", "low", "high") if v[end] is not None}
        | {f"tokens_per_second.{k}": v["tokens_per_second"]["median"] for k, v in methods.items()}
        | {f"efficiency.{k}": v["efficiency"] for k, v in result["efficiency"].items()}
        | {f"fidelity.{k}": v["quality"]["fidelity"] for k, v in methods.items()}
        | {f"task_drop.{k}": v["quality"].get("task_drop") for k, v in methods.items()}
        | {"numerical_ties": len(result["numerical_ties"])},
        {"task": result["task"]}, [result["files"]["json"], result["files"]["md"]])


def run_sweep(params: Params, pair_name: str | None, task: str, kind: str, values: list[int], prompts: int,
              max_new_tokens: int | None, repeats: int, gamma: int | None, device: str, dtype: str,
              methods: list[str] | None = None, progress: bool = True, engine: dict | None = None) -> dict:
    """Tokens/s and peak memory of `methods` against one knob (or, for `position`, milliseconds per
    generated token with that many tokens already in the cache); a table, JSON and a plot."""
    if kind not in SWEEPS:
        raise BenchError(f"unknown sweep {kind!r}; choose from {', '.join(SWEEPS)}")
    pair, models = load_bench_models(params, pair_name, device, dtype)
    if kind == "frontier":
        return run_frontier(params, pair.name, models, task, prompts, max_new_tokens, repeats, gamma, progress, engine)
    engine = engine_options(params, engine)
    default = ["hf_ar", "ar"] if kind == "position" else SWEEP_METHODS
    methods = [m for m in (methods or default) if m not in ("cascade_sd", "viasd") or models.slims]
    gamma = gamma or params.decode.gamma
    max_new = max_new_tokens or params.max_new_tokens(task)
    viasd = tuned_settings(params, pair.name, task, required=False)
    points = []
    if kind == "position":
        table = method_table(models, methods, gamma, max_new, viasd, params.decode.spec_cascade(),
                             engine)
        for value in values:
            ms = per_token_seconds(models, table, bench_prompts(params, models, task, prompts, value), repeats=repeats)
            points.append({kind: value, **{name: {"ms_per_token": 1000 * sec} for name, sec in ms.items()}})
        return _write_sweep(params, pair.name, task, kind, values, methods, points, gamma, max_new, prompts, engine,
                            run_setting(models))
    for value in values:
        g, n_new, length = gamma, max_new, None
        if kind == "gamma":
            g = value
        elif kind == "length":
            n_new = value
        else:
            length = value
        settings = {**viasd, "gamma": g} if kind == "gamma" else viasd
        table = method_table(models, methods, g, n_new, settings, params.decode.spec_cascade(), engine)
        res = run_benchmark(models, bench_prompts(params, models, task, prompts, length), table, n_new, repeats, progress)
        points.append({kind: value, **{name: {"tokens_per_second": row["tokens_per_second"]["median"],
                                              "peak_memory_mb": row["peak_memory_mb"]}
                                       for name, row in res["methods"].items()}})
    return _write_sweep(params, pair.name, task, kind, values, methods, points, gamma, max_new, prompts, engine,
                        run_setting(models))


def _write_sweep(params, pair, task, kind, values, methods, points, gamma, max_new, prompts, engine, setting) -> dict:
    out = {"pair": pair, "task": task, "sweep": kind, **engine, **setting, "values": values, "methods": methods,
           "points": points, "gamma": gamma, "max_new_tokens": max_new, "prompts": prompts}
    if kind == "position" and len(points) > 1:
        out["last_vs_first"] = {m: points[-1][m]["ms_per_token"] / points[0][m]["ms_per_token"] for m in methods}
    paths = bench_paths(params, pair, task, kind, **engine, **setting)
    unit = "ms per token" if kind == "position" else "tokens/s (peak MB)"
    lines = [f"# {pair} on {task}: {unit} vs {kind}\n", "| " + kind + " | " + " | ".join(methods) + " |",
             "|---|" + "---|" * len(methods)]
    for p in points:
        cells = [f"{p[m]['ms_per_token']:.2f}" if kind == "position" else
                 f"{p[m]['tokens_per_second']:.1f} ({p[m]['peak_memory_mb'] or 0:.0f})" for m in methods]
        lines.append(f"| {p[kind]} | " + " | ".join(cells) + " |")
    write_text(paths["md"], "\n".join(lines) + "\n")
    _sweep_plot(out, paths["png"])
    write_json(paths["json"], out)
    return {**out, "files": paths}


def _sweep_plot(out: dict, path) -> None:
    from ..io import pyplot, save_figure

    plt = pyplot()
    kind = out["sweep"]
    position = kind == "position"
    fig, axes = plt.subplots(1, 1 if position else 2, figsize=(5 if position else 10, 4), squeeze=False)
    speed, mem = axes[0][0], (None if position else axes[0][1])
    for m in out["methods"]:
        xs = [p[kind] for p in out["points"]]
        speed.plot(xs, [p[m]["ms_per_token" if position else "tokens_per_second"] for p in out["points"]],
                   marker="o", label=m)
        if mem is not None:
            mem.plot(xs, [p[m]["peak_memory_mb"] or 0 for p in out["points"]], marker="o", label=m)
    panels = [(speed, "ms per token" if position else "tokens/s (median)")]
    panels += [] if mem is None else [(mem, "peak memory (MB)")]
    for ax, label in panels:
        ax.set_xlabel({"gamma": "gamma (draft block length)", "length": "generated tokens",
                       "prompt": "prompt tokens", "position": "tokens in the cache"}[kind])
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    speed.legend(fontsize=8)
    fig.suptitle(f"{out['pair']} on {out['task']}: cost vs {kind}", fontsize=10)
    save_figure(fig, path)
    plt.close(fig)


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
    from .timing import BenchMethod

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


def run_batch_sweep(params: Params, pair_name: str | None, task: str, batch_sizes: list[int], prompts: int,
                    max_new_tokens: int | None, repeats: int, gamma: int | None, device: str, dtype: str,
                    methods: list[str] | None = None, progress: bool = True, engine: dict | None = None) -> dict:
    """Throughput and latency against batch size (`bench.batch`): `hf_ar`, `ar`, `sd` at its best gamma on dev and the
    tuned `viasd` by default; a table, JSON and a plot, reports/bench/<pair>-<task>-sweep-batch.*"""
    from .batch import BATCH_METHODS, batch_markdown, batch_plot, run_batch_benchmark

    pair, models = load_bench_models(params, pair_name, device, dtype)
    engine = engine_options(params, engine)
    gamma, source = bench_gamma(params, pair.name, task, gamma)
    max_new = max_new_tokens or params.max_new_tokens(task)
    chosen = methods or [m for m in BATCH_METHODS if m != "viasd" or models.slims]
    tuned = tuned_settings(params, pair.name, task, required=False)
    own = baseline_settings(params, pair.name, task) if source == "SD's best on dev" else {}
    table = method_table(models, chosen, gamma, max_new, tuned, params.decode.spec_cascade(), engine, None,
                         floor_budget(fidelity_floor(params)), own)
    references, metric = task_references(params, task, prompts, max_new)
    result = run_batch_benchmark(models, bench_prompts(params, models, task, prompts), table, sorted(set(batch_sizes)),
                                 max_new, repeats, progress, references, metric)
    weight = next(models.target.parameters())
    title = (f"viasd bench --batch: {pair.name} on {task}, {prompts} prompts x {max_new} tokens, sd at gamma {gamma} "
             f"({source}), {weight.device}, {str(weight.dtype).removeprefix('torch.')}")
    result.update({"pair": pair.name, "task": task, "sweep": "batch", "gamma": gamma, "gamma_source": source, **engine,
                   "device": str(weight.device), "dtype": str(weight.dtype), "title": title})
    paths = bench_paths(params, pair.name, task, "batch", **engine, **run_setting(models))
    write_text(paths["md"], batch_markdown(result, title))
    batch_plot(result, paths["png"])
    write_json(paths["json"], result)
    return {**result, "files": paths}


def batch_record(result: dict) -> StageRecord:
    """A batch sweep as an MLflow run: per batch size each method's tokens/s and latency, the ratios with
    their intervals, every method's quality."""
    metrics = {}
    for row in result["rows"]:
        b = row["batch"]
        for name, m in row["methods"].items():
            metrics[f"tokens_per_second.{name}.batch_{b}"] = m["tokens_per_second"]
            metrics[f"latency_s.{name}.batch_{b}"] = m["latency_s"]
        for key, r in row["ratios"].items():
            for end in ("ratio", "low", "high"):
                if r and r.get(end) is not None:
                    metrics[f"interval.{key}.batch_{b}.{end}"] = r[end]
    for name, q in result["quality"].items():
        metrics |= {f"{k}.{name}": q[k] for k in ("fidelity", "task_drop") if q.get(k) is not None}
    return StageRecord("bench", f"bench/{result['pair']}/{result['task']}/batch",
                       {"prompts": result["prompts"], "max_new_tokens": result["max_new_tokens"], "gamma": result["gamma"],
                        "repeats": result["repeats"], "batch_sizes": ",".join(map(str, result["batch_sizes"])),
                        "device": result["device"], "dtype": result["dtype"]},
                       metrics, {"task": result["task"], "sweep": "batch"},
                       [result["files"]["json"], result["files"]["md"], result["files"]["png"]])
