"""Where every stage's files live, in one place: each stage and the workflow ask here, by pair, task,
run or slim, instead of asking one another. Paths only: nothing is read or written."""

from __future__ import annotations

from pathlib import Path

from ..config import Params
from ..decoding.policy import DEFAULT_CACHE


def main_cost(params: Params) -> str:
    return params.dimr.cost



def mask_dir(params: Params, pair: str) -> Path:
    return params.models_dir / "masks" / pair



def plot_dir(params: Params, pair: str) -> Path:
    return params.reports_dir / "dimr" / pair



def main_prefix(params: Params) -> int:
    return params.dimr.keep_prefix



def mask_paths(params: Params, pair: str | None = None, cost: str | None = None, prefix: int | None = None) -> dict:
    """Output paths of the pair's search; `cost` other than `dimr.cost` names the cost-ablation search,
    `prefix` other than `dimr.keep_prefix` the prefix-ablation search (layers 0..prefix-1 kept)."""
    pair = pair or params.pair().name
    masks, plots = mask_dir(params, pair), plot_dir(params, pair)
    if prefix not in (None, main_prefix(params)) and cost in (None, main_cost(params)):
        name = f"prefix-{prefix}"
        return {"mask": masks / f"{name}.json", "trace": masks / f"{name}.trace.jsonl",
                "curve": plots / f"{name}-search.png", "layers": plots / f"{name}-layers.png",
                "storage": params.models_dir / "optuna" / f"dimr-{pair}.db"}
    if cost in (None, main_cost(params)):
        return {"mask": masks / "mask.json", "trace": masks / "trace.jsonl", "curve": plots / "search.png",
                "layers": plots / "layers.png", "storage": params.models_dir / "optuna" / f"dimr-{pair}.db",
                **{b: masks / f"{b}.json" for b in ("random", "truncate", "every_other")}}
    return {"mask": masks / f"cost-{cost}.json", "trace": masks / f"cost-{cost}.trace.jsonl",
            "curve": plots / f"cost-{cost}-search.png", "layers": plots / f"cost-{cost}-layers.png",
            "storage": params.models_dir / "optuna" / f"dimr-{pair}.db"}



def threshold_dirs(params: Params, task: str, pair: str | None = None) -> dict[str, Path]:
    name = f"{pair or params.pair().name}-{task}"
    return {"models": params.models_dir / "thresholds" / name, "plots": params.reports_dir / "thresholds" / name}



def threshold_paths(params: Params, task: str, pair: str | None = None, slim: str = "main") -> dict:
    pair = pair or params.pair().name
    dirs = threshold_dirs(params, task, pair)
    return {"json": dirs["models"] / f"{slim}.json", "trace": dirs["models"] / f"{slim}.trace.jsonl",
            "storage": params.models_dir / "optuna" / f"thresholds-{pair}-{task}-{slim}.db",
            "plot": dirs["plots"] / f"{slim}.png"}



def batch_table_paths(params: Params, pair: str, task: str) -> dict:
    """`viasd batch-table`'s outputs: one folder per pair and task (its DVC out and Snakemake directory)."""
    base = params.reports_dir / "batch" / pair / task
    return {"dir": base, "json": base / "batch.json", "md": base / "batch.md", "png": base / "batch.png"}



def decode_paths(params: Params, pair: str, task: str, run: str) -> dict:
    base = params.reports_dir / "decode" / pair / task
    return {"rows": base / f"{run}.jsonl", "summary": base / f"{run}.json"}



def eval_path(params: Params, pair: str, task: str, run: str) -> Path:
    """A run's evaluation (`viasd evaluate`): its decode summary with the quality measures."""
    return params.reports_dir / "eval" / pair / task / f"{run}.json"


def bench_paths(params: Params, pair: str, task: str, sweep: str | None = None, cache: str = DEFAULT_CACHE,
                compile: bool = False, device: str = "cpu", dtype: str = "float32", reuse: bool | None = None,
                generation_config: bool | None = None, generation: dict | None = None, split: str = "test") -> dict:
    """reports/bench/<pair>-<task>[-sweep-<kind>][-<cache>][-compiled][-reuse|-no_reuse][-<device>][-<dtype>]
    [-generation-<hash>][-<split>].{json,md,png}: a cache kind other than `inplace`, torch.compile, reuse other than
    `decode.reuse`, a device other than the CPU, a dtype other than float32, generation settings other
    than `decode.generation_config` / `decode.generation` and a split other than test are in the name, so runs of
    each setting sit side by side (`device` is a type: `cuda`)."""
    import hashlib
    import json

    base = params.reports_dir / "bench"
    reuse_default = params.decode.reuse
    reuse = reuse_default if reuse is None else reuse
    gen_default = [params.decode.generation_config, dict(params.decode.generation)]
    gen = [gen_default[0] if generation_config is None else generation_config,
           gen_default[1] if generation is None else dict(generation)]
    gen_tag = "generation-" + hashlib.md5(json.dumps(gen, sort_keys=True).encode()).hexdigest()[:8]
    tags = [t for t, default in ((cache, DEFAULT_CACHE), ("compiled" if compile else "", ""),
                                 ("reuse" if reuse else "no_reuse", "reuse" if reuse_default else "no_reuse"),
                                 (device.split(":")[0], "cpu"), (dtype, "float32"),
                                 (gen_tag if gen != gen_default else "", ""), (split, "test")) if t != default]
    stem = "-".join([f"{pair}-{task}", *([f"sweep-{sweep}"] if sweep else []), *tags])
    return {"json": base / f"{stem}.json", "md": base / f"{stem}.md", "png": base / f"{stem}.png"}



def report_paths(params: Params) -> dict:
    base = params.reports_dir
    out = {"summary": base / "summary.md", "metrics": base / "metrics.json"}
    for pair in params.study.pairs:
        for task in params.study.tasks:
            key = f"{pair}-{task}"
            out[f"{key}.md"] = base / "tables" / f"{key}.md"
            out[f"{key}.csv"] = base / "tables" / f"{key}.csv"
            out[f"{key}-frontier"] = base / "plots" / f"{key}-frontier.png"
            out[f"{key}-tiers"] = base / "plots" / f"{key}-tiers.png"
            out[f"{key}-slims.md"] = base / "tables" / f"{key}-slims.md"
            out[f"{key}-slims.csv"] = base / "tables" / f"{key}-slims.csv"
            out[f"{key}-positions.md"] = base / "tables" / f"{key}-positions.md"
            out[f"{key}-pass-costs.md"] = base / "tables" / f"{key}-pass-costs.md"
    for pair in params.study.pairs:
        out[f"{pair}-family.md"] = base / "tables" / f"{pair}-family.md"
        out[f"{pair}-family.csv"] = base / "tables" / f"{pair}-family.csv"
    out["stage-times"] = base / "tables" / "stage-times.md"
    out["claims.md"] = base / "tables" / "claims.md"
    return out


def router_paths(params: Params, pair: str, drafter: str = "model") -> dict:
    """The learned router of the pair's DIMR slim (`viasd train-router`) and its reliability plot, fitted on blocks
    the `drafter` drafted (`model`: the draft model's, `main.json`; `feature`: the feature drafter's; `self`: the
    target's first layers')."""
    name = "main" if drafter == "model" else f"drafter_{drafter}"
    return {"router": params.models_dir / "routers" / pair / f"{name}.json",
            "plot": params.reports_dir / "router" / pair / ("reliability.png" if drafter == "model"
                                                             else f"reliability-{name}.png")}


def task_split(params: Params, task: str, split: str) -> dict:
    """A task's split as a `StageRecord` dataset: `{"<task>-<split>": (its prompts file, split)}`."""
    from ..tasks.base import examples_path

    return {f"{task}-{split}": (examples_path(params.data.dir, task, split), split)}
