"""`viasd dimr-search`: the DIMR mask of a pair, the baseline masks, trace and plots.

Outputs (one directory per pair, so that a workflow declares one output):
  models/masks/<pair>/mask.json          the mask the engine loads: keep_layers, cost, budget, seed, trials, times,
                                         and `agreement`: teacher-forced greedy agreement with the target (and NLL)
                                         of the draft, the slim, each baseline slim and the independent model
  models/masks/<pair>/trace.jsonl        every trial: number, phase, kept layers, cost, seconds
  models/masks/<pair>/<baseline>.json    random / truncate / every_other masks of the same budget, with their cost
  models/masks/<pair>/cost-<fn>.json     the cost ablation: the search with the other cost function (+ .trace.jsonl)
  reports/dimr/<pair>/search.png, layers.png (and cost-<fn>-search.png, cost-<fn>-layers.png)
  models/optuna/dimr-<pair>.db           the Optuna studies (resumable; one study per parameter set). Kept
                                         outside the output directory, which workflows delete before a rerun.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict

from ..config import Pair, Params
from ..decoding.seq2seq import is_encoder_decoder
from ..decoding.slim import RoutingMask, num_decoder_layers
from ..io import write_json, write_jsonl
from ..search.calibration_set import load_calibration
from ..search.dimr import DimrConfig, MaskCost, baseline_mask, dimr_search, result_json
from ..search.plots import layer_keep_frequency, search_curve
from ..search.storage import optuna_storage, study_name
from ..search.workers import SERIAL, Worker
from ..study.cells import input_files
from ..study.paths import main_cost, main_prefix, mask_paths
from ..study.record import StageRecord

log = logging.getLogger(__name__)


def dimr_config(params: Params, **overrides) -> DimrConfig:
    return DimrConfig(seed=params.seed, **{**params.dimr.search_settings(), **overrides})


def grid_searches(params: Params) -> list[dict]:
    """Every DIMR search the study needs, as overrides of `dimr`: the main one (`{}`), each other cost a
    `cost_<fn>` run asks for, and each prefix a `prefix_<n>` run asks for."""
    from ..study.runs import parse_run

    out = [{}] + [{"cost": c} for c in grid_costs(params)[1:]]
    for run in params.study.runs:
        prefix = parse_run(run).prefix
        if prefix is not None and prefix != main_prefix(params) and {"keep_prefix": prefix} not in out:
            out.append({"keep_prefix": prefix})
    return out


def grid_costs(params: Params) -> list[str]:
    """The cost functions the study needs searched: `dimr.cost`, plus any a `cost_<fn>` run asks for."""
    from ..study.runs import parse_run

    costs = [main_cost(params)]
    for run in params.study.runs:
        kind = parse_run(run).mask_kind
        if kind and kind.startswith("cost_") and kind[len("cost_"):] not in costs:
            costs.append(kind[len("cost_"):])
    return costs


def run_dimr_stage(params: Params, progress: bool = True, pair: Pair | None = None, records: list | None = None,
                   worker: Worker = SERIAL, **overrides) -> dict | None:
    """Search (or continue, or skip when already done with these parameters); returns the mask JSON.
    `records`: the search's `StageRecord` is appended to it (for the tracking boundary). `worker` (one
    of `dimr.workers` processes on one storage): run this worker's share of the trials and write
    nothing (returns None); the stage run without a worker then picks the mask."""
    from ..models import load_models

    pair = pair or params.pair()
    cfg = dimr_config(params, **overrides)
    cfg.check()
    main = cfg.cost == main_cost(params) and cfg.keep_prefix == main_prefix(params)
    baselines = _baselines(params) if main else []
    paths = mask_paths(params, pair.name, cfg.cost, cfg.keep_prefix)
    if paths["mask"].exists():
        previous = json.loads(paths["mask"].read_text())
        if previous.get("config") == asdict(cfg) and all(paths[b].exists() for b in baselines):
            log.info("DIMR mask %s is up to date; nothing to do", paths["mask"])
            if records is not None:
                records.append(dimr_record(params, pair, {**previous, "up_to_date": True}, []))
            return {**previous, "up_to_date": True}
    calibration = load_calibration(params.data.dir / "calibration.parquet")
    models = load_models(pair.target, draft=pair.draft, device=params.device, dtype=pair.dtype,
                         trust_remote_code=pair.trust_remote_code)
    cfg.budget(num_decoder_layers(models.target))  # fail early on an impossible budget
    encoder_keep = cfg.encoder_keep(models.target)
    cost = MaskCost(models.target, models.draft, calibration, models.vocab_size, cfg.cost, cfg.batch_size,
                    encoder_keep)
    storage = optuna_storage(params.study.optuna_storage, paths["storage"], params.models_dir.parent,
                             params.search_heartbeat(params.dimr.workers))
    search_name = study_name(f"dimr-{pair.name}", asdict(cfg))
    result = dimr_search(cost, cfg, storage, search_name, progress, worker)
    if result is None:
        return None
    out = result_json(result, cfg, pair=pair.name, target=pair.target, draft=pair.draft)
    found = RoutingMask.from_layers(result.keep_layers, result.num_layers)
    encoder = {}
    if encoder_keep is not None:  # the measured option: the same decoder mask with the target's whole encoder
        encoder = {"encoder_keep_layers": list(encoder_keep), "encoder_num_layers": cost.encoder_layers}
        out.update(encoder, cost_shared_encoder=cost.exact(found))
    baseline_masks = {name: baseline_mask(name, result.num_layers, result.budget_layers, cfg.seed) for name in baselines}
    for name, mask in baseline_masks.items():
        write_json(paths[name], {"keep_layers": list(mask.keep_layers), "cost": cost(mask), "cost_fn": cfg.cost,
                                 "num_layers": result.num_layers, "budget_layers": result.budget_layers,
                                 "baseline": name, "seed": cfg.seed, **encoder})
    if main:
        masks = {"slim": found, **baseline_masks}
        out["agreement"] = family_agreement(params, pair, models, {name: cost.routed(m) for name, m in masks.items()})
    write_jsonl(paths["trace"], result.trials)
    title = f"DIMR ({cfg.cost} cost), keep {result.budget_layers}/{result.num_layers} layers"
    search_curve(storage, search_name, cfg.n_random, paths["curve"], title)
    layer_keep_frequency(result.trials, result.num_layers, paths["layers"], title)
    write_json(paths["mask"], out)  # last: its presence marks a finished search
    if records is not None:
        records.append(dimr_record(params, pair, out, result.trials))
    return out


def dimr_record(params: Params, pair: Pair, out: dict, trials: list[dict]) -> StageRecord:
    """The search's MLflow run: its settings, the mask's cost and search cost, each trial as a child run."""
    prefix = out["config"].get("keep_prefix", 0)
    paths = mask_paths(params, pair.name, out["cost_fn"], prefix)
    trials = sorted(trials, key=lambda t: t["number"])
    return StageRecord(
        "dimr_search", f"dimr_search/{pair.name}/{out['cost_fn']}" + (f"-prefix{prefix}" if prefix else ""),
        out["config"],
        {k: out[k] for k in ("cost", "best_random_cost", "trials", "search_seconds", "reference_seconds",
                             "forward_passes", "budget_layers")} | {"up_to_date": out.get("up_to_date", False)},
        {"keep_layers": ",".join(map(str, out["keep_layers"])), "cost_fn": out["cost_fn"]},
        [p for k, p in paths.items() if k != "storage"], {"trial_cost": [t["cost"] for t in trials]},
        inputs=input_files(params, pair) | {"data.calibration": params.data.dir / "calibration.parquet"},
        children=[{"name": f"trial {t['number']}", "params": {"keep_layers": ",".join(map(str, t["keep_layers"])),
                                                              "phase": t.get("phase")},
                   "metrics": {"cost": t["cost"], "seconds": t.get("seconds")}} for t in trials],
        up_to_date=out.get("up_to_date", False))


def family_agreement(params: Params, pair: Pair, models, masks: dict) -> dict:
    """Teacher-forced greedy agreement with the target, and NLL, of the draft, each slim of `masks`
    (name -> `RoutingMask`) and the pair's independent model, on windows spread over the corpus's test
    split (the trained family; hub pairs, whose tokenizer is another, on the calibration set)."""
    from ..decoding.slim import SlimVerifier
    from ..models import load_model
    from ..search.calibration_set import greedy_choices, spread_windows, window_logits, window_targets
    from ..training.train import load_token_stream

    length, sequences = params.data.calibration_length, params.data.calibration_sequences
    if pair.trained:
        split, tokens = "test", spread_windows(load_token_stream(params.data.dir, "test"), sequences, length)
    else:
        split, tokens = "calibration", load_calibration(params.data.dir / "calibration.parquet")
    target = models.target
    device = next(target.parameters()).device
    tokens = tokens.to(device)
    vocab = models.vocab_size
    forwards = {"target": target, "draft": models.draft}
    forwards.update({name: SlimVerifier(target, mask).model for name, mask in masks.items()})
    if pair.independent:
        forwards["independent"] = load_model(pair.independent, device=str(device), dtype=pair.dtype,
                                             trust_remote_code=pair.trust_remote_code)
    seq2seq = is_encoder_decoder(target)
    out = {"split": split, "tokens": int(window_targets(tokens, seq2seq).numel())}
    reference = None  # the target's choices: the first model measured
    for name, model in forwards.items():
        choices, nll = greedy_choices(lambda ids, m=model: window_logits(m, ids), tokens, vocab, encoder_decoder=seq2seq)
        reference = choices if reference is None else reference
        out[name] = {"agreement": round((choices == reference).float().mean().item(), 4), "nll": round(nll, 4)}
    return out


def _baselines(params: Params) -> list[str]:
    return list(params.dimr.baselines)
