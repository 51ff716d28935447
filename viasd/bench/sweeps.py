"""`viasd bench --sweep` and `--batch`: tokens/s and peak memory of the methods against one knob (gamma, generated
length, prompt length, position in the cache), and throughput and latency against batch size (`bench.batch`).

Outputs: reports/bench/<pair>-<task>-sweep-<kind>.{json,md,png} (`tree`: `sweep-tree-depth<gamma>-top_k<k>`).
"""

from __future__ import annotations

from ..config import Params
from ..io import write_json, write_text
from ..study.cells import engine_options, tuned_settings
from ..study.paths import bench_paths
from ..study.record import StageRecord
from .command import (
    bench_gamma,
    bench_prompts,
    load_bench_models,
    run_setting,
    study_table,
    task_references,
)
from .frontier import run_frontier
from .methods import BenchError, method_table
from .timing import per_token_seconds, run_benchmark

SWEEPS = ("gamma", "length", "prompt", "position", "frontier", "tree")
SWEEP_METHODS = ["hf_ar", "ar", "sd", "viasd"]


def run_sweep(params: Params, pair_name: str | None, task: str, kind: str, values: list[int], prompts: int,
              max_new_tokens: int | None, repeats: int, gamma: int | None, device: str, dtype: str,
              methods: list[str] | None = None, progress: bool = True, engine: dict | None = None,
              draft_layers: str | None = None, tree_top_k: int = 4, split: str = "test") -> dict:
    """Tokens/s, accepted draft tokens per block and peak memory of `methods` against one knob (or, for `position`,
    milliseconds per generated token with that many tokens already in the cache); a table, JSON and a plot. `tree`:
    the `sd-tree` methods' `tree_nodes` (with `tree_top_k`), the chains beside them unchanged. `split`: the prompts'
    (dev where the sweep makes a choice, such as a tree's shape)."""
    if kind not in SWEEPS:
        raise BenchError(f"unknown sweep {kind!r}; choose from {', '.join(SWEEPS)}")
    pair, models = load_bench_models(params, pair_name, device, dtype, draft_layers)
    if kind == "frontier":
        return run_frontier(params, pair.name, models, task, prompts, max_new_tokens, repeats, gamma, progress, engine)
    engine = engine_options(params, engine)
    default = {"position": ["hf_ar", "ar"], "tree": ["ar", "sd", "sd-tree"]}.get(kind, SWEEP_METHODS)
    methods = [m for m in (methods or default) if m not in ("cascade_sd", "viasd") or models.slims]
    gamma = gamma or params.decode.gamma
    max_new = max_new_tokens or params.max_new_tokens(task)
    viasd = tuned_settings(params, pair.name, task, required=False)
    points = []
    if kind == "position":
        table = method_table(models, methods, gamma, max_new, viasd, params.decode.spec_cascade(),
                             engine)
        for value in values:
            ms = per_token_seconds(models, table, bench_prompts(params, models, task, prompts, value, split),
                                   repeats=repeats)
            points.append({kind: value, **{name: {"ms_per_token": 1000 * sec} for name, sec in ms.items()}})
        return _write_sweep(params, pair.name, task, kind, values, methods, points, gamma, max_new, prompts, engine,
                            run_setting(models), split)
    for value in values:
        g, n_new, length = gamma, max_new, None
        if kind == "gamma":
            g = value
        elif kind == "length":
            n_new = value
        else:
            length = value
        settings = {**viasd, "gamma": g} if kind == "gamma" else viasd
        tree = {"tree_nodes": value, "tree_top_k": tree_top_k} if kind == "tree" else None
        table = method_table(models, methods, g, n_new, settings, params.decode.spec_cascade(), engine, tree=tree)
        res = run_benchmark(models, bench_prompts(params, models, task, prompts, length, split), table, n_new, repeats,
                            progress)
        points.append({kind: value, **{name: {"tokens_per_second": row["tokens_per_second"]["median"],
                                              "peak_memory_mb": row["peak_memory_mb"],
                                              "accepted_per_block": row["mean_accepted_length"]}
                                       for name, row in res["methods"].items()},
                       "intervals": {k: v for k, v in res["intervals"].items() if v}})
    return _write_sweep(params, pair.name, task, kind, values, methods, points, gamma, max_new, prompts, engine,
                        run_setting(models), split, tree_top_k if kind == "tree" else None)


def _write_sweep(params, pair, task, kind, values, methods, points, gamma, max_new, prompts, engine, setting,
                 split: str = "test", tree_top_k: int | None = None) -> dict:
    out = {"pair": pair, "task": task, "sweep": kind, **engine, **setting, "values": values, "methods": methods,
           "points": points, "gamma": gamma, "max_new_tokens": max_new, "prompts": prompts, "split": split,
           **({"tree_top_k": tree_top_k} if tree_top_k else {})}
    if kind == "position" and len(points) > 1:
        out["last_vs_first"] = {m: points[-1][m]["ms_per_token"] / points[0][m]["ms_per_token"] for m in methods}
    # a tree sweep's depth and top-k are in its name: sweeps of other shapes sit beside it
    name = f"{kind}-depth{gamma}-top_k{tree_top_k}" if kind == "tree" else kind
    paths = bench_paths(params, pair, task, name, **engine, **setting, split=split)
    unit = "ms per token" if kind == "position" else "tokens/s (peak MB; accepted draft tokens per block)"
    lines = [f"# {pair} on {task}: {unit} vs {kind}\n", "| " + kind + " | " + " | ".join(methods) + " |",
             "|---|" + "---|" * len(methods)]
    for p in points:
        cells = [f"{p[m]['ms_per_token']:.2f}" if kind == "position" else
                 f"{p[m]['tokens_per_second']:.1f} ({p[m]['peak_memory_mb'] or 0:.0f}"
                 + ("" if p[m].get("accepted_per_block") is None else f"; {p[m]['accepted_per_block']:.2f}") + ")"
                 for m in methods]
        lines.append(f"| {p[kind]} | " + " | ".join(cells) + " |")
    pairs = sorted({k for p in points for k in p.get("intervals", {})})
    if pairs:  # the paired per-prompt ratios of each point, with their 95 % intervals (`metrics.speed`)
        from ..metrics.speed import describe

        lines += ["", f"Paired ratios per {kind} (geometric mean over prompts [95 % CI]):", "",
                  "| " + kind + " | " + " | ".join(pairs) + " |", "|---|" + "---|" * len(pairs)]
        lines += [f"| {p[kind]} | " + " | ".join(describe(p["intervals"][k]) if k in p.get("intervals", {}) else "–"
                                                  for k in pairs) + " |" for p in points]
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
                       "prompt": "prompt tokens", "position": "tokens in the cache",
                       "tree": f"draft-tree nodes (top-k {out.get('tree_top_k')})"}[kind])
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    speed.legend(fontsize=8)
    fig.suptitle(f"{out['pair']} on {out['task']}: cost vs {kind}", fontsize=10)
    save_figure(fig, path)
    plt.close(fig)


def run_batch_sweep(params: Params, pair_name: str | None, task: str, batch_sizes: list[int], prompts: int,
                    max_new_tokens: int | None, repeats: int, gamma: int | None, device: str, dtype: str,
                    methods: list[str] | None = None, progress: bool = True, engine: dict | None = None,
                    draft_layers: str | None = None, paths: dict | None = None) -> dict:
    """Throughput and latency against batch size (`bench.batch`): `hf_ar`, `ar`, `sd` at its best gamma on dev and the
    tuned `viasd` by default; a table, JSON and a plot, reports/bench/<pair>-<task>-sweep-batch.* (or `paths`'
    `md`, `png` and `json`: the study's batch table)"""
    from .batch import BATCH_METHODS, batch_markdown, batch_plot, run_batch_benchmark

    pair, models = load_bench_models(params, pair_name, device, dtype, draft_layers)
    engine = engine_options(params, engine)
    gamma, source = bench_gamma(params, pair.name, task, gamma)
    max_new = max_new_tokens or params.max_new_tokens(task)
    chosen = methods or [m for m in BATCH_METHODS if m != "viasd" or models.slims]
    _, table, _ = study_table(params, pair.name, models, task, chosen, gamma, source, max_new, engine)
    references, metric = task_references(params, task, prompts, max_new)
    result = run_batch_benchmark(models, bench_prompts(params, models, task, prompts), table, sorted(set(batch_sizes)),
                                 max_new, repeats, progress, references, metric)
    weight = next(models.target.parameters())
    command = "viasd batch-table" if paths else "viasd bench --batch"
    title = (f"{command}: {pair.name} on {task}, {prompts} prompts x {max_new} tokens, sd at gamma {gamma} "
             f"({source}), {weight.device}, {str(weight.dtype).removeprefix('torch.')}")
    result.update({"pair": pair.name, "task": task, "sweep": "batch", "gamma": gamma, "gamma_source": source, **engine,
                   "device": str(weight.device), "dtype": str(weight.dtype), "title": title})
    paths = paths or bench_paths(params, pair.name, task, "batch", **engine, **run_setting(models))
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
