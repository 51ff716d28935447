"""`viasd bench`: the benchmark on a pair and task of the study, and what every bench run shares (the pair's
models with their slim, router and feature drafter, the task's prompts, references and groups, SD's gamma and the
lossless baselines' own settings on dev).

Outputs: reports/bench/<pair>-<task>.json (+ .md). The scaling sweeps and the batch-size sweep are in
`bench.sweeps`, the speed-quality frontier in `bench.frontier`.
"""

from __future__ import annotations

import logging

from ..config import ConfigError, Params
from ..decoding.policy import METHODS
from ..decoding.tier_router import floor_budget
from ..io import write_json, write_text
from ..study.cells import engine_options, fidelity_floor, tuned_settings
from ..study.paths import bench_paths, mask_paths, router_paths, threshold_paths
from ..study.record import StageRecord
from .figures import markdown
from .methods import HF, VIASD_VARIANTS, BenchError, early_exit_layers, method_table
from .timing import run_benchmark

log = logging.getLogger(__name__)


def run_setting(models) -> dict:
    """The loaded models' device type and dtype name, as `bench_paths` takes them."""
    first = next(models.target.parameters())
    return {"device": first.device.type, "dtype": str(first.dtype).removeprefix("torch.")}


def load_bench_models(params: Params, pair_name: str | None, device: str, dtype: str, draft_layers: str | None = None):
    """The pair, with its DIMR mask as slim verifier when the search has run, its learned router when
    `viasd train-router` has fitted one, the family's feature drafter when `viasd train-drafter` has trained it, and
    the target's first layers as the self-drafter of the `-drafter_self` methods: `draft_layers` ("0,1"), else
    `models.self_drafter`'s (with the router `viasd train-router` refitted on its blocks, where it has)."""
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
    if draft_layers:
        from ..decoding.slim import RoutingMask, num_decoder_layers

        models.set_self_drafter(RoutingMask.parse(draft_layers, num_decoder_layers(models.target)))
    else:  # the study's self-drafter, and its own router where one was fitted
        from ..study.slims import use_self_drafter

        try:
            use_self_drafter(params, models)
        except ConfigError as err:  # too deep for this target: the -drafter_self methods then say so
            log.info("no self-drafter: %s", err)
            return pair, models
        self_router = router_paths(params, pair.name, "self")["router"]
        if self_router.exists():
            models.self_router = load_router(self_router)
    return pair, models


def bench_prompts(params: Params, models, task: str, n: int, length: int | None = None,
                  split: str = "test") -> list[list[int]]:
    """`n` prompts of the task's `split` (the test split unless a choice is being made on dev), token ids from the
    benchmarked pair's tokenizer (or the stored ids of prompts cut from a token stream); with `length`, windows of
    that many tokens from the test corpus instead (the prompt-length sweep)."""
    from ..tasks import load_examples

    if length is None:
        examples = load_examples(params.data.dir, task, split)[:n]
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
    """self_sd's, cascade_sd's and SD's with another drafter (`sd-drafter_feature`, `sd-drafter_self`) own best
    settings on dev, where the DIMR slim's threshold search measured them (the study's grid has those runs):
    {method: DecodePolicy fields}. A baseline the search did not measure runs at SD's best gamma, as `sd` (logged)."""
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
    for drafter in ("feature", "self"):
        if best_key(params, "sd", drafter) in found:
            out[f"sd-drafter_{drafter}"] = best_settings(params, pair, task, "sd", drafter)
    return out


def bench_groups(params: Params, task: str, n: int, split: str = "test") -> list[str]:
    """The source-file group of each of the first `n` prompts of `split` (the speed intervals' clusters)."""
    from ..tasks import get_task, load_examples

    spec = get_task(task)
    return [str(spec.group(e)) for e in load_examples(params.data.dir, task, split)[:n]]


def task_references(params: Params, task: str, n: int, max_new: int, split: str = "test"
                    ) -> tuple[list[str] | None, str | None]:
    """The references of the first `n` prompts of `split` and the task's main metric, for quality beside speed
    (None when the task has no text metric)."""
    from ..metrics.quality import main_metric
    from ..tasks import get_task, load_examples

    metric = main_metric(get_task(task).metrics)
    if metric is None or metric == "pass_at_1":  # pass@1 needs the task's tests and stop rules: see the study
        return None, None
    return [e.reference for e in load_examples(params.data.dir, task, split)[:n]], metric


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


def study_table(params: Params, pair: str, models, task: str, methods: list[str], gamma: int, source: str,
                max_new: int, engine: dict, tree: dict | None = None) -> tuple[list[str], list, dict]:
    """The benchmark methods with the study's settings: the tuned `viasd`, `viasd-rules`, `viasd-drafter_feature` and
    `viasd-drafter_self` (at `models.self_drafter`'s layers) from their own searches (left out where a search did not
    run), the lossless baselines at their own best settings on dev (where `sd` runs at its best gamma), `spec_cascade`
    as params.yaml sets it, the budgeted oracle at the fidelity floor. Returns (the methods kept, `method_table`'s
    table, the baselines' own settings)."""
    rules = threshold_paths(params, task, pair, "rules")["json"]
    methods = [m for m in methods if m != "viasd-rules" or rules.exists()]  # the rules' own search, when it ran
    variants = {"viasd-rules": tuned_settings(params, pair, task, "rules", required=False)} if rules.exists() else {}
    if threshold_paths(params, task, pair, "drafter_feature")["json"].exists():  # its own search, when it ran
        variants["viasd-drafter_feature"] = tuned_settings(params, pair, task, "drafter_feature")
    if threshold_paths(params, task, pair, "drafter_self")["json"].exists() and models.self_router is not None:
        variants["viasd-drafter_self"] = tuned_settings(params, pair, task, "drafter_self")  # at its search's layers
    tuned = tuned_settings(params, pair, task, required=False)
    own = baseline_settings(params, pair, task) if source == "SD's best on dev" else {}
    table = method_table(models, methods, gamma, max_new, tuned, params.decode.spec_cascade(), engine, variants,
                         floor_budget(fidelity_floor(params)), own, tree)
    return methods, table, own


def run_bench_stage(params: Params, pair_name: str | None, task: str, methods: list[str], prompts: int,
                    max_new_tokens: int | None, repeats: int, gamma: int | None, device: str, dtype: str,
                    progress: bool = True, engine: dict | None = None, draft_layers: str | None = None,
                    tree: dict | None = None, split: str = "test") -> dict:
    """The bench (`viasd bench`): `methods` on the first `prompts` prompts of the task's `split` (test; dev where a
    choice is being made, e.g. whether a draft tree pays), timed side by side with quality beside speed."""
    pair, models = load_bench_models(params, pair_name, device, dtype, draft_layers)
    if "hf_early_exit" in methods and methods == default_methods(params) and not _prefix_slim(models):
        log.info("hf_early_exit left out: the pair's slim does not keep a prefix of the target's layers")
        methods = [m for m in methods if m != "hf_early_exit"]
    engine = engine_options(params, engine)
    gamma, source = bench_gamma(params, pair.name, task, gamma)
    max_new = max_new_tokens or params.max_new_tokens(task)
    methods, table, own = study_table(params, pair.name, models, task, methods, gamma, source, max_new, engine, tree)
    references, metric = task_references(params, task, prompts, max_new, split)
    result = run_benchmark(models, bench_prompts(params, models, task, prompts, split=split), table, max_new, repeats,
                           progress, references, metric, bench_groups(params, task, prompts, split))
    weight = next(models.target.parameters())
    result.update({"pair": pair.name, "task": task, "prompts": prompts, "max_new_tokens": max_new, "gamma": gamma,
                   "gamma_source": source, "baseline_settings": {m: v for m, v in own.items() if m in methods},
                   "repeats": repeats, "split": split, **engine, "device": str(weight.device),
                   "dtype": str(weight.dtype),
                   "slim_layers": list(models.slims[0].mask.keep_layers) if models.slims else None})
    if any(m.policy is not None and m.policy.tree_nodes for m in table):
        result["tree"] = next({"tree_nodes": m.policy.tree_nodes, "tree_top_k": m.policy.tree_top_k,
                               "tree_depth": m.policy.gamma} for m in table if m.policy is not None and m.policy.tree_nodes)
    paths = bench_paths(params, pair.name, task, **engine, **run_setting(models), split=split)
    write_text(paths["md"], markdown(result, f"viasd bench: {pair.name} on {task} ({split}), {prompts} prompts x {max_new} "
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
    split = result.get("split", "test")
    return StageRecord(
        "bench", f"bench/{result['pair']}/{result['task']}" + ("" if split == "test" else f"/{split}"),
        {**{k: result[k] for k in ("prompts", "max_new_tokens", "gamma", "repeats", "device", "dtype", "cache",
                                   "compile", "reuse")}, "split": split, **result.get("tree", {})},
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
