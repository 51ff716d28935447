"""`viasd tune-thresholds`: VIA-SD thresholds for a pair and task, on the dev split, per slim verifier.

Outputs, one directory per pair and task (so a workflow declares one output), one file set per slim
(`main` = the DIMR mask; with `thresholds.per_slim`, also every slim ablation of `study.runs`, see
`study/slims.py`):
  models/thresholds/<pair>-<task>/<slim>.json          what the decode stage reads: gamma, tau_accept,
                                                       tau_slim, tier rules, with their dev figures
  models/thresholds/<pair>-<task>/<slim>.trace.jsonl   every trial
  reports/thresholds/<pair>-<task>/<slim>.png          the speed-quality trade-off, chosen point marked
  models/optuna/thresholds-<pair>-<task>-<slim>.db     the resumable Optuna study (outside the outputs)
The tiers-off point (plain SD) is a candidate of every search: when it is the cheapest feasible one the
file says `tiers_off: true` (tau_accept and tau_slim "inf") and the decode of that slim is SD.
Nothing is written for a slim whose search meets no candidate under the quality constraints.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
from dataclasses import asdict, replace

from ..config import ConfigError, Pair, Params
from ..decoding.tier_router import headroom_share
from ..io import write_json, write_jsonl, write_text
from ..metrics.quality import QualityConstraints
from ..search.dev_set import DevSet
from ..search.pass_cost import PassCost, costs_from_json, costs_to_json
from ..search.plots import speed_quality
from ..search.storage import optuna_storage, study_name
from ..search.thresholds import (
    CHOICE_FIELDS,
    POLICY_KEYS,
    ThresholdConfig,
    budgeted_oracle_point,
    oracle_points,
    searched_space,
    tune_thresholds,
)
from ..search.wall_factors import calibrated
from ..search.workers import SERIAL, Worker, completed_points
from ..study.baselines import BASELINE_BESTS, baseline_bests, baseline_signature, drafter_digest
from ..study.cells import engine_options, input_files, search_base
from ..study.paths import router_paths, task_split, threshold_paths
from ..study.record import StageRecord
from ..study.slims import (
    drafter_of,
    load_run_models,
    mask_file,
    search_order,
    slim_description,
    slim_spec,
    slims_to_tune,
)
from ..tasks import get_task, load_examples
from ..tasks.base import TaskError, examples_path, split_by_group

log = logging.getLogger(__name__)

# the cost model's version, part of a search's signature: a search costed under another model (v1: one
# cost per runner layout, prefill averaged in) is not resumed or reused but run again
COST_MODEL = ("v5: per layout and width, the prompt's explicit prefill excluded, the decode loop's per-block work, "
              "calibrated per gamma on the dev decodes' wall time")

WARM_START = 4  # an ablation slim's search first tries the DIMR slim's cheapest feasible tiered policies


def threshold_config(params: Params) -> ThresholdConfig:
    section = {k: tuple(v) if isinstance(v, list) else v for k, v in params.thresholds.search.items()}
    section["quality"] = QualityConstraints.from_dict(section.get("quality"))
    seed = params.seed if params.thresholds.seed is None else params.thresholds.seed
    return ThresholdConfig(seed=seed, **section)


def _json_value(value):
    """Off tiers (inf) as the string "inf", which `DecodePolicy` reads back as a float."""
    return "inf" if isinstance(value, float) and math.isinf(value) else value


def run_thresholds_stage(params: Params, task: str | None = None, progress: bool = True,
                         pair: Pair | None = None, slims: list[str] | None = None,
                         records: list | None = None, worker: Worker = SERIAL, search: str | None = None
                         ) -> dict[str, dict]:
    """Tune the thresholds of each slim (default: `slims_to_tune`); returns {slim: result}.

    The per-pass costs of the cost model are measured once per runner layout, in the `main` (DIMR mask)
    search, and shared by the other slims' searches whose layouts they cover (a slim of the budget's size
    with the same shared prefix), so those slims are compared by what they do (pass counts at the quality
    constraints), not by timing noise between searches; a slim of another layout measures its own.
    The target's greedy dev outputs and the tiers-off (SD) points are computed once and shared too, and
    the other slims' searches run `thresholds.ablation_trials` trials, starting from the hand rules'
    cheapest feasible policies.

    With the `rules` search in the grid (the `viasd-rules` run), it runs first, with the full
    `n_trials`: the hand rules on the DIMR slim, searched alone. The `main` search then searches who
    decides by `thresholds.routers` (by default the learned router alone: a categorical choice between
    conditional spaces leaves each too few trials) and picks the cheapest feasible policy among its own
    trials, the rules' trials and SD, so the tuned `viasd` is the best of both. `records`: each search's
    `StageRecord` is appended to it (for the tracking boundary).

    `worker` (one of `thresholds.workers` processes on one storage): run this worker's share of every
    search's trials, in the same order, and write nothing; the stage run without a worker then picks
    (and runs any trial a lost worker left). Its results are then partial: `pass_cost_model` and the
    `worker_trials` that warm-start the ablations.

    `search` (one of `search_order`; with `worker` a `PART`): run that one search's trials, as the serial
    stage would, and write nothing. The first search must be complete before any other's part runs (its
    costs and trials are the others' starting point): `thresholds.split_searches` runs the first's part,
    then the others' side by side, then the serial stage, which finds every study complete and picks."""
    pair = pair or params.pair()
    task = task or params.thresholds.task
    slims = stage_slims = slims or slims_to_tune(params)
    main_mask = slim_description(params, pair.name, slim_spec("main"))

    def twin(slim: str) -> bool:  # a slim ablation whose mask is the DIMR mask: main's search decides it
        return slim not in ("main", "rules") and "main" in stage_slims and drafter_of(slim) == "model" and \
            slim_description(params, pair.name, slim_spec(slim)) == main_mask

    if search is not None:
        order = search_order(slims)
        if search not in order:
            raise ConfigError(f"--search {search}: the searches of this stage are {', '.join(order)}")
        if twin(search):
            log.info("slim %s keeps the DIMR mask's layers: main's search decides it; nothing to run", search)
            return {}
        slims = list(dict.fromkeys([order[0], search]))  # the first search (complete: no trials), then this one
    results: dict[str, dict] = {}
    common: dict = {}
    for first in [s for s in ("rules", "main") if s in slims]:
        shared = costs_from_json(results["rules"]["pass_cost_model"]) if "rules" in results else None
        extra = searched_trials(params, pair.name, task, "rules") if first == "main" and "rules" in results else []
        results[first] = tune_slim(params, pair, task, first, progress, shared, common=common, candidates=extra,
                                   worker=worker)
    first = results.get("rules") or results.get("main")
    shared = costs_from_json(first["pass_cost_model"]) if first else None
    warm = warm_start_points(params, pair.name, task, trials=(first or {}).get("worker_trials"))
    for slim in slims:
        if slim in ("main", "rules"):
            continue
        if twin(slim):
            if not worker.partial:
                results[slim] = same_mask_as_main(params, pair.name, task, slim, results["main"])
        else:  # another drafter's search starts from its router's diagonal, as main's (not the rules' policies)
            results[slim] = tune_slim(params, pair, task, slim, progress, shared, common=common,
                                      warm_start=warm if drafter_of(slim) == "model" else (), worker=worker)
    if records is not None and not worker.partial:
        trials = common.get("trials", {})
        records.extend(threshold_record(params, pair, slim, out, trials.get(out.get("same_mask_as", slim), []))
                       for slim, out in results.items())
    return results


def threshold_record(params: Params, pair: Pair, slim: str, out: dict, trials: list[dict]) -> StageRecord:
    """One slim's search as an MLflow run: the chosen policy and its dev figures, each candidate trial a
    child run (`trials`: the search's points; its tiers-off points are left out, the trials of another
    search that competed in its choice, e.g. the hand rules' in the DIMR slim's, are kept)."""
    trials = sorted((t for t in trials if not t["tiers_off"]), key=lambda t: t["number"])
    paths = threshold_paths(params, out["task"], pair.name, slim)
    mask = mask_file(params, pair.name, slim_spec(slim))
    slim_input = {"mask": mask} if mask is not None else {}
    if slim == "independent" and pair.trained:
        slim_input = {"model.independent": params.model_dir("independent")}
    return StageRecord(
        "tune_thresholds", f"tune_thresholds/{pair.name}/{out['task']}/{slim}",
        {k: out[k] for k in (*POLICY_KEYS, "tiers_off", "quality_constraints")}
        | {"search": out["signature"]["config"], "slim_layers": out["mask"]},
        {**{k: v for k, v in out["dev"].items() if not isinstance(v, list)}, "cost_vs_sd": out["cost_vs_sd"],
         "trials": out["trials"], "up_to_date": out.get("up_to_date", False),
         **{k: out[k] for k in ("headroom_taken", "headroom_taken_at_floor") if out.get(k) is not None}},
        {"task": out["task"], "slim": slim}, [paths["json"], paths["plot"]],
        {"trial_cost_per_token": [t["cost_per_token"] for t in trials],
         "trial_fidelity": [t["fidelity"] for t in trials],
         "trial_task_drop": [t["task_drop"] for t in trials if t.get("task_drop") is not None]},
        inputs=input_files(params, pair, out["task"]) | slim_input
        | {"data.dev": examples_path(params.data.dir, out["task"], "dev")},
        children=[{"name": f"trial {t['number']}", "params": {k: _json_value(t.get(k)) for k in POLICY_KEYS},
                   "metrics": {**{k: t.get(k) for k in ("cost_per_token", "fidelity", "task_drop", "agreement",
                                                        "rejection_rate", "prompts")},
                               "feasible": float(bool(t.get("feasible")))}} for t in trials],
        up_to_date=out.get("up_to_date", False), datasets=task_split(params, out["task"], "dev"))


def dev_examples(params: Params, task: str) -> tuple[list, list]:
    """The task's dev examples the search decodes (`thresholds.dev_prompts`) and the held-out ones that confirm
    its choice (`thresholds.confirm_prompts`), from disjoint groups of the task (source files for the stdlib
    tasks: `split_by_group`), so that the confirmation is evidence the search could not have fitted; one clear
    error if the split has too few."""
    examples = load_examples(params.data.dir, task, "dev")
    n, k = params.thresholds.dev_prompts, params.thresholds.confirm_prompts
    try:
        return split_by_group(examples, n, k, get_task(task).group)
    except TaskError as e:
        raise ConfigError(f"thresholds: dev_prompts {n} + confirm_prompts {k} from disjoint source files of {task}: "
                          f"{e}; raise tasks.{task}.dev_prompts (then `viasd prepare-data`) or lower "
                          "thresholds.confirm_prompts") from None


def _sd_cost(out: dict) -> float:
    """The cheapest feasible tiers-off (SD) point's modelled cost per token."""
    return min(t["cost_per_token"] for t in out["trials"] if t["tiers_off"] and t["feasible"])


def sd_best(out: dict) -> dict:
    """The cheapest feasible tiers-off (SD) point of a search's outcome: its gamma and dev costs."""
    best = min((t for t in out["trials"] if t["tiers_off"] and t["feasible"]), key=lambda t: t["cost_per_token"])
    return {k: best.get(k) for k in ("gamma", "cost_per_token", "wall_per_token", "rejection_rate", "acceptance_rate")}


def same_mask_as_main(params: Params, pair: str, task: str, slim: str, main: dict) -> dict:
    """A baseline mask that is the DIMR mask itself (e.g. `truncate` when the search picked the prefix):
    its search would tune the same slim again, so it takes the main result, marked `same_mask_as`."""
    result = {**{k: v for k, v in main.items() if k != "up_to_date"}, "slim": slim, "same_mask_as": "main"}
    main_paths, paths = threshold_paths(params, task, pair, "main"), threshold_paths(params, task, pair, slim)
    if paths["json"].exists() and json.loads(paths["json"].read_text()) == result:
        return {**result, "up_to_date": True}
    log.info("slim %s keeps the same layers as the DIMR mask %s: it takes the main thresholds", slim, main["mask"])
    write_text(paths["trace"], main_paths["trace"].read_text() if main_paths["trace"].exists() else "")
    if main_paths["plot"].exists():
        tmp = paths["plot"].with_name(paths["plot"].name + ".tmp")
        shutil.copyfile(main_paths["plot"], tmp)
        tmp.replace(paths["plot"])
    write_json(paths["json"], result)
    return result


def searched_trials(params: Params, pair: str, task: str, slim: str) -> list[dict]:
    """The Optuna trials a slim's search wrote to its trace (not its tiers-off points), "inf" read as a float."""
    trace = threshold_paths(params, task, pair, slim)["trace"]
    if not trace.exists():
        return []
    trials = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    return [{k: (math.inf if v == "inf" else v) for k, v in t.items()} for t in trials
            if not t.get("tiers_off") and t.get("search") is None]


def warm_start_points(params: Params, pair: str, task: str, k: int = WARM_START, trials: list[dict] | None = None
                      ) -> list[dict]:
    """The `k` cheapest feasible hand-rule trials of the `rules` search (else of the main search): the
    slim ablations' searches use the hand rules and start from them (none before a search has run).
    `trials`: that search's trials as a worker read them from the storage (else its trace file)."""
    trials = trials or searched_trials(params, pair, task, "rules") or searched_trials(params, pair, task, "main")
    tiered = [t for t in trials if t.get("feasible") and t.get("router", "rules") == "rules"]
    return sorted(tiered, key=lambda t: t["cost_per_token"])[:k]


def slim_config(params: Params, slim: str) -> ThresholdConfig:
    """The search settings of one slim's search: `thresholds.rules_trials` for the hand rules' search,
    `ablation_trials` for the other slims', whose searches (and `rules`) use the hand rules only (the
    router is fitted for the DIMR slim); another drafter's search (`drafter_feature`) is main's, its router
    refitted on that drafter's blocks."""
    section = params.thresholds
    cfg = threshold_config(params)
    if drafter_of(slim) != "model":  # VIA-SD on another drafter: main's search, with that drafter and its router
        return cfg
    if slim not in ("main", "rules") and section.ablation_trials:
        cfg = replace(cfg, n_trials=section.ablation_trials)
    if slim == "rules" and section.rules_trials:
        cfg = replace(cfg, n_trials=section.rules_trials)
    if slim != "main":
        cfg = replace(cfg, routers=("rules",))
    return cfg


def _prompts_digest(examples: list) -> str:
    """A digest of which prompts a set holds (ids and prompt text): the search's and the held-out set."""
    return hashlib.sha256(json.dumps([[e.id, e.prompt] for e in examples]).encode()).hexdigest()


def search_signature(params: Params, pair: str, task: str, slim: str, cfg: ThresholdConfig,
                     pass_cost: dict[str, PassCost] | None, router_file, candidates: list[dict],
                     searched: list, held_out: list) -> dict:
    """Everything a search's result depends on, as it reads back from the thresholds file: an equal
    signature there means the result is up to date. The config is `searched_space`: the fields of a router the
    search does not draw are left out. `searched`, `held_out`: `dev_examples`."""
    signature = {"config": searched_space(cfg), "engine": engine_options(params), "task": task,
                 "dev_prompts": params.thresholds.dev_prompts, "confirm_prompts": params.thresholds.confirm_prompts,
                 "prompts": _prompts_digest(searched), "held_out": _prompts_digest(held_out),
                 "slim": slim, "mask": slim_description(params, pair, slim_spec(slim)), "cost_model": COST_MODEL}
    if pass_cost is not None:
        signature["pass_cost_model"] = costs_to_json(pass_cost)
    if params.thresholds.batch_size > 1:  # batched dev decodes: the wall times come from fewer prompts
        signature["batch"] = {"batch_size": params.thresholds.batch_size, "wall_prompts": params.thresholds.wall_prompts}
    if drafter_of(slim) == "feature":  # a retrained feature drafter is a new search
        signature["drafter"] = drafter_digest(params, params.pair(pair))
    if drafter_of(slim) == "self":  # as is another depth of the self-drafter
        signature["drafter"] = {"self_layers": params.self_drafter.layers}
    if router_file is not None:  # a refitted router is a new search
        signature["router"] = hashlib.sha256(router_file.read_bytes()).hexdigest() if router_file.exists() else None
    if slim == "main":  # the file then carries the lossless baselines' own best settings on dev too
        signature.update(baseline_signature(params, params.pair(pair)))
    if candidates:  # another search's trials compete in the choice: the result depends on them too
        signature["candidates"] = hashlib.sha256(json.dumps(candidates, sort_keys=True).encode()).hexdigest()
    return json.loads(json.dumps(signature))


DEV_KEYS = ("cost_per_token", "cost_model_per_token", "wall_per_token", "decode_wall_per_token",
            "fidelity", "fidelity_se", "fidelity_lower_bound", "groups", "nll",
            "agreement", "task_metric", "task_score", "task_score_ar", "task_drop", "rejection_rate", "acceptance_rate",
            "block_escalation_rate", "gated_rate", "full_passes_per_token", "position_pass_rates", "passes_per_token",
            "pass_widths_per_token", "speedup_model_vs_ar")


def _oracle_json(oracle: dict | None, out: dict) -> dict | None:
    if oracle is None:
        return None
    return {"gamma": oracle["gamma"], "cost_per_token": oracle["cost_per_token"],
            "sd_over_oracle_cost": _sd_cost(out) / oracle["cost_per_token"], "fidelity": oracle["fidelity"],
            "position_escalation_rate": oracle["position_escalation_rate"], "slim_error_rate": oracle["slim_error_rate"],
            **({"oracle_budget": oracle["oracle_budget"]} if "oracle_budget" in oracle else {})}


def result_json(out: dict, cfg: ThresholdConfig, oracle: dict | None, signature: dict,
                at_floor: dict | None = None) -> dict:
    """The thresholds file of a search's outcome `out` (`tune_thresholds`): the chosen policy, its dev
    figures, SD's at its gamma, the oracle's ceiling and the share of its headroom taken (both modelled), and
    the budgeted oracle's at the fidelity floor (`at_floor`: `budgeted_oracle_point`)."""
    best, sd = out["best"], out["sd"]

    def taken(ceiling: dict | None) -> float | None:
        return None if ceiling is None else headroom_share(_sd_cost(out) / best["cost_per_token"],
                                                           _sd_cost(out) / ceiling["cost_per_token"])

    return {
        **{k: _json_value(best[k]) for k in POLICY_KEYS}, "tiers_off": best["tiers_off"], "mask": signature["mask"],
        "dev": {k: best.get(k) for k in DEV_KEYS},
        "sd_same_gamma": {k: sd[k] for k in ("cost_per_token", "wall_per_token", "rejection_rate", "acceptance_rate")},
        "cost_vs_sd": best["cost_per_token"] / sd["cost_per_token"],
        # SD at its own best gamma on these dev prompts: the lossless baselines (sd, cascade_sd) decode at it
        "sd_best": sd_best(out),
        "oracle": _oracle_json(oracle, out), "oracle_at_floor": _oracle_json(at_floor, out),
        # the share of the oracle's headroom over the cheapest SD point that the tuned policy takes (modelled),
        # and of the budgeted oracle's at the fidelity floor
        "headroom_taken": taken(oracle), "headroom_taken_at_floor": taken(at_floor),
        "quality_constraints": asdict(cfg.quality),
        "trials": sum(1 for t in out["trials"] if not t["tiers_off"] and t.get("search") is None),
        "pass_cost_model": costs_to_json(out["pass_cost"]), "ar_seconds_per_token": out["ar_seconds_per_token"],
        # per gamma: the dev decodes' wall time over their modelled cost, which every cost above is multiplied by
        "wall_factors": {str(g): f for g, f in out["wall_factors"].items()},
        "signature": signature,
    }


def tune_slim(params: Params, pair: Pair, task: str, slim: str, progress: bool = True,
              pass_cost: dict[str, PassCost] | None = None, common: dict | None = None,
              warm_start: list[dict] = (), candidates: list[dict] = (), worker: Worker = SERIAL) -> dict:
    """One slim's search; `pass_cost` shares per-pass costs (per runner layout and width) fitted in another search
    (None, or costs that miss one of this slim's layouts: measure); `common` carries the `SharedDev` of
    the first search to the next; `warm_start`: policies tried first (an ablation slim's search)."""
    cfg = slim_config(params, slim)
    spec = slim_spec(slim)
    drafter = drafter_of(slim)
    router_file = router_paths(params, pair.name, drafter)["router"] if "learned" in cfg.routers else None
    paths = threshold_paths(params, task, pair.name, slim)
    engine = engine_options(params)
    examples, held_out = dev_examples(params, task)
    signature = search_signature(params, pair.name, task, slim, cfg, pass_cost, router_file, candidates, examples,
                                 held_out)
    if paths["json"].exists() and json.loads(paths["json"].read_text()).get("signature") == signature:
        log.info("thresholds %s are up to date; nothing to do", paths["json"])
        return {**json.loads(paths["json"].read_text()), "up_to_date": True}
    models = load_run_models(params, pair, spec, mask_file(params, pair.name, spec))
    if router_file is not None:
        from ..training.tier_router import load_router

        models.router = load_router(router_file)
    common = {} if common is None else common
    base = replace(search_base(params, task), drafter=drafter)
    batching = {"batch_size": params.thresholds.batch_size, "wall_prompts": params.thresholds.wall_prompts}
    dev = DevSet(models, examples, params.max_new_tokens(task), get_task(task).stop_strings, pass_cost,
                 task=get_task(task), engine=engine, shared=_shared(common, "dev", drafter), base=base, **batching)
    common[_shared_key("dev", drafter)] = dev.shared
    confirm = None
    if held_out and not worker.partial:  # the choice is confirmed by the stage's final (serial) run
        confirm = DevSet(models, held_out, params.max_new_tokens(task), get_task(task).stop_strings, dev.pass_cost,
                         task=get_task(task), engine=engine, shared=_shared(common, "confirm", drafter), base=base,
                         **batching)
        common[_shared_key("confirm", drafter)] = confirm.shared
    log.info("tuning thresholds for %s on %s with slim %s", pair.name, task, slim)
    # the study is named by what its trials depend on: not the fields that only select among them (CHOICE_FIELDS),
    # the candidates of another search (they compete in the choice, not in the search) or the held-out prompts
    # (they only check the choice); a change of those re-selects from the same, resumed study
    searched = {**{k: v for k, v in signature.items()
                   if k not in ("candidates", "confirm_prompts", "held_out", *BASELINE_BESTS)},
                "config": {k: v for k, v in signature["config"].items() if k not in CHOICE_FIELDS}}
    storage = optuna_storage(params.study.optuna_storage, paths["storage"], params.models_dir.parent,
                             params.search_heartbeat(params.thresholds.workers))
    name = study_name(f"thresholds-{pair.name}-{task}-{slim}", searched)
    out = tune_thresholds(dev, cfg, storage, name, progress, warm_start=warm_start,
                          candidates=[{**c, "search": "rules"} for c in candidates], confirm=confirm, worker=worker)
    if out is None:  # a worker's share: the study's cost model as stored (the first stored, if two workers measured
        # at once: the searches after it are named by it) and its trials, for the searches after it
        stored, points = completed_points(storage, name, "pass_cost_model")
        return {"pass_cost_model": stored or costs_to_json(dev.pass_cost), "worker_trials": points}
    best = out["best"]
    common.setdefault("trials", {})[slim] = out["trials"]
    # the oracle router on the same dev prompts (greedy searches of the DIMR slim): the ceiling a router has
    # (its cost calibrated with the search's factors, as every candidate's)
    factors = out["wall_factors"]
    oracle = min((calibrated(p, factors) for p in oracle_points(dev, cfg)), key=lambda t: t["cost_per_token"]) \
        if (slim == "main" or drafter != "model") and dev.base.sampling.greedy else None
    # and the budgeted oracle at the fidelity floor: the ceiling of a router that spends the same fidelity
    at_floor = budgeted_oracle_point(dev, cfg, oracle["gamma"]) if oracle is not None else None
    at_floor = at_floor and calibrated(at_floor, factors)
    result = {**result_json(out, cfg, oracle, signature, at_floor), "task": task, "pair": pair.name, "slim": slim,
              "confirm": {"prompts": len(held_out), "checks": out["confirm"]}}
    result.update(baseline_bests(params, pair, dev, cfg, signature, result["sd_best"]["gamma"]))
    if best["tiers_off"]:
        log.info("thresholds %s: tiers off (plain SD at gamma %d) is the cheapest policy that meets %s",
                 paths["json"], best["gamma"], cfg.quality.describe())
    write_jsonl(paths["trace"], [{k: _json_value(v) for k, v in t.items()} for t in out["trials"]])
    speed_quality(out["trials"], best, cfg.quality, paths["plot"],
                  f"VIA-SD thresholds, {pair.name} on {task} (dev), slim: {slim}")
    write_json(paths["json"], result)
    return result


def _shared_key(key: str, drafter: str) -> str:
    return key if drafter == "model" else f"{key}-{drafter}"


def _shared(common: dict, key: str, drafter: str):
    """The `SharedDev` a search of `drafter` reuses from an earlier search of the stage: the target's references
    are every search's; the tiers-off (SD) points are its drafter's own."""
    own = _shared_key(key, drafter)
    if own not in common and key in common and own != key:
        return replace(common[key], tiers_off=None)
    return common.get(own)

