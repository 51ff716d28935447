"""`viasd dimr-search`: the DIMR mask of the configured pair, the baseline masks, trace and plots.

Outputs (under `models/masks/` and `reports/dimr/`, named by the pair):
  <pair>.json               the mask the engine loads: keep_layers, cost, budget, seed, trials, times
  <pair>.trace.jsonl        every trial: number, phase, kept layers, cost, seconds
  <pair>.optuna.db          the Optuna study (resumable)
  <pair>-<baseline>.json    random / truncate / every_other masks of the same budget, with their cost
  reports/dimr/<pair>-search.png, <pair>-layers.png
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

from ..config import Params
from ..io import write_json, write_jsonl
from ..search.calibration import load_calibration
from ..search.dimr import DimrConfig, MaskCost, baseline_mask, dimr_search, result_json
from ..search.plots import layer_keep_frequency, search_curve

log = logging.getLogger(__name__)


def dimr_config(params: Params, **overrides) -> DimrConfig:
    section = {k: v for k, v in params.raw.get("dimr", {}).items() if k != "baselines"}
    return DimrConfig(seed=params.seed, **{**section, **overrides})


def mask_paths(params: Params, pair: str | None = None) -> dict:
    pair = pair or params.family.name
    masks = params.models_dir / "masks"
    reports = params.models_dir.parent / "reports" / "dimr"
    return {"mask": masks / f"{pair}.json", "trace": masks / f"{pair}.trace.jsonl",
            "storage": masks / f"{pair}.optuna.db", "curve": reports / f"{pair}-search.png",
            "layers": reports / f"{pair}-layers.png",
            **{b: masks / f"{pair}-{b}.json" for b in ("random", "truncate", "every_other")}}


def run_dimr_stage(params: Params, progress: bool = True, **overrides) -> dict:
    """Search (or continue, or skip when already done with these parameters); returns the mask JSON."""
    from ..models import load_models

    cfg = dimr_config(params, **overrides)
    cfg.check()
    paths = mask_paths(params)
    if paths["mask"].exists():
        previous = json.loads(paths["mask"].read_text())
        if previous.get("config") == asdict(cfg) and all(paths[b].exists() for b in _baselines(params)):
            log.info("DIMR mask %s is up to date; nothing to do", paths["mask"])
            return {**previous, "up_to_date": True}
    calibration = load_calibration(params.data.dir / "calibration.parquet")
    models = load_models(params.model_dir("target"), draft=params.model_dir("draft"), device="auto")
    cfg.budget(models.target.config.num_hidden_layers)  # fail early on an impossible budget
    cost = MaskCost(models.target, models.draft, calibration, models.vocab_size, cfg.cost, cfg.batch_size)
    paths["storage"].parent.mkdir(parents=True, exist_ok=True)
    result = dimr_search(cost, cfg, f"sqlite:///{paths['storage']}", f"dimr-{params.family.name}", progress)
    out = result_json(result, cfg, target=str(params.model_dir("target")), draft=str(params.model_dir("draft")))
    for name in _baselines(params):
        mask = baseline_mask(name, result.num_layers, result.budget_layers, cfg.seed)
        write_json(paths[name], {"keep_layers": list(mask.keep_layers), "cost": cost(mask), "cost_fn": cfg.cost,
                                 "num_layers": result.num_layers, "budget_layers": result.budget_layers,
                                 "baseline": name, "seed": cfg.seed})
    write_jsonl(paths["trace"], result.trials)
    title = f"DIMR ({cfg.cost} cost), keep {result.budget_layers}/{result.num_layers} layers"
    search_curve(result.trials, paths["curve"], title)
    layer_keep_frequency(result.trials, result.num_layers, paths["layers"], title)
    write_json(paths["mask"], out)  # last: its presence marks a finished search
    return out


def _baselines(params: Params) -> list[str]:
    return list(params.raw.get("dimr", {}).get("baselines", []))
