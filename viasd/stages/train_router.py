"""`viasd train-router`: the learned router of a pair's DIMR slim (docs/method.md, "The router").

Rows: oracle decodes (`router: oracle`) of the calibration windows' first `router.prompt_tokens` tokens,
`router.max_new_tokens` new tokens each, at block length `router.gamma` (default: the largest gamma the
threshold search tries, so that every block position it can pick is seen). The calibration split is the
one the mask search uses: no task prompt, dev or test, is read. Fit, the choice of probe and L2 on
validation decodes (`router.probe: auto`, a list of `router.l2`), and held-out figures: `training.router`.
Outputs: `models/routers/<pair>/main.json` (the router, its held-out AUC / ECE and the oracle decodes'
figures) and `reports/router/<pair>/reliability.png`; for each other drafter a `viasd` run of the grid drafts
with (`drafter_feature`), a router refitted on that drafter's blocks, `drafter_feature.json` beside them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict

import torch

from ..config import Params
from ..decoding.policy import DecodePolicy
from ..decoding.reuse import prefix_length
from ..decoding.stats import DecodeStats
from ..decoding.tier_router import RouterRows
from ..search.calibration_set import load_calibration
from ..study.cells import engine_options, input_files
from ..study.paths import mask_paths, router_paths
from ..study.record import StageRecord
from ..study.slims import feature_drafter_dir, read_json, use_self_drafter
from ..training.tier_router import fit_router, save_router

log = logging.getLogger(__name__)

def router_config(params: Params) -> dict:
    """`router:` of params.yaml over the defaults (gamma: the largest of `thresholds.gamma`)."""
    cfg = asdict(params.router)
    if cfg["gamma"] is None:
        cfg["gamma"] = max(params.thresholds.search.get("gamma", [4]))
    return cfg


def _router_cost(router, gamma: int, width: int, repeats: int = 2000) -> float:
    """Seconds per block of the router's decision (both heads on `gamma + 1` rows), on the CPU."""
    z = torch.randn((gamma + 1, width))
    router.draft(z[:-1]), router.slim(z)
    start = time.perf_counter()
    for _ in range(repeats):
        router.draft(z[:-1]), router.slim(z)
    return (time.perf_counter() - start) / repeats


def run_router_stage(params: Params, pair_name: str | None = None, progress: bool = True,
                     drafter: str = "model") -> dict:
    """Collect the rows (blocks `drafter` drafted: the draft model, the feature drafter, or the target's first
    layers), fit, write the
    router and its reliability plot; returns the stage's record."""
    from tqdm.auto import tqdm

    from ..models import load_models
    from ..search.plots import router_reliability_plot

    pair = params.pair(pair_name)
    cfg = router_config(params)
    mask_path = mask_paths(params, pair.name)["mask"]
    keep = read_json(mask_path, "the routing mask")["keep_layers"]
    feature = drafter == "feature"
    models = load_models(pair.target, draft=pair.draft if drafter == "model" else None, masks=[mask_path],
                         device=params.device, dtype=pair.dtype, trust_remote_code=pair.trust_remote_code,
                         feature_drafter=feature_drafter_dir(params, pair) if feature else None)
    if drafter == "self":  # the target's own first layers draft (models.self_drafter)
        use_self_drafter(params, models)
    windows = load_calibration(params.data.dir / "calibration.parquet")[: cfg["prompts"]]
    engine = engine_options(params)
    policy = DecodePolicy(method="viasd", router="oracle", gamma=cfg["gamma"], max_new_tokens=cfg["max_new_tokens"],
                          eos_token_ids=(), seed=params.seed, drafter=drafter, **engine)
    rows, parts = RouterRows(), []
    start = time.perf_counter()
    for k, window in enumerate(tqdm(windows, desc="router: oracle decodes", disable=not progress, unit="prompt")):
        rows.current_group = k
        parts.append(models.generate(window[: cfg["prompt_tokens"]].tolist(), policy, router_rows=rows).stats)
    collect_seconds = time.perf_counter() - start
    data = rows.tensors()
    available = prefix_length(keep) if cfg["probe"] is not False and data["hidden"].shape[1] else 0
    if cfg["probe"] is not False and not available:
        log.info("router: no probe (the decode shares no trunk with the full model: decode.reuse off or a mask "
                 "without layer 0)")
    probes = (0, available) if cfg["probe"] == "auto" else (available,)
    start = time.perf_counter()
    router = fit_router(data, probes, cfg["l2"], cfg["holdout"], params.seed)
    fit_seconds = time.perf_counter() - start
    stats = DecodeStats.merge(parts)
    width = len(router.features) + (data["hidden"].shape[1] if router.probe_layers else 0)
    router.info.update({
        "pair": pair.name, "drafter": drafter, "keep_layers": keep,
        "collect": {k: cfg[k] for k in ("gamma", "prompts", "prompt_tokens", "max_new_tokens")},
        "oracle": {"slim_error_rate": stats.slim_error_rate, "position_escalation_rate": stats.position_escalation_rate,
                   "block_escalation_rate": stats.block_escalation_rate, "tokens": stats.new_tokens,
                   "blocks": stats.blocks},
        "collect_seconds": collect_seconds, "fit_seconds": fit_seconds,
        "decision_seconds_per_block": _router_cost(router, cfg["gamma"], width)})
    paths = router_paths(params, pair.name, drafter)
    save_router(router, paths["router"])
    router_reliability_plot(router.info, paths["plot"])
    metrics = {"rows": router.info["rows"], "heldout_rows": router.info["heldout_rows"],
               "draft_auc": router.info["draft"]["auc"], "draft_ece": router.info["draft"]["ece"],
               "slim_auc": router.info["slim"]["auc"], "slim_ece": router.info["slim"]["ece"],
               "draft_base_rate": router.info["draft"]["base_rate"], "slim_base_rate": router.info["slim"]["base_rate"],
               "oracle_slim_error_rate": stats.slim_error_rate,
               "oracle_position_escalation_rate": stats.position_escalation_rate,
               "collect_seconds": collect_seconds, "fit_seconds": fit_seconds,
               "decision_seconds_per_block": router.info["decision_seconds_per_block"]}
    config = {**cfg, "drafter": drafter, "probe_layers": router.probe_layers, "l2_draft": router.info["l2"]["draft"],
              "l2_slim": router.info["l2"]["slim"]}
    return {"pair": pair.name, "drafter": drafter, "config": config, "metrics": metrics,
            "artifacts": [paths["router"], paths["plot"]]}


def router_record(params: Params, out: dict) -> StageRecord:
    """The router's MLflow run: its settings, held-out AUC and ECE, the router file and reliability plot."""
    pair = params.pair(out["pair"])
    name = pair.name if out.get("drafter", "model") == "model" else f"{pair.name}/drafter_{out['drafter']}"
    return StageRecord("train_router", f"train_router/{name}", out["config"], out["metrics"], {}, out["artifacts"],
                       inputs=input_files(params, pair) | {"mask": mask_paths(params, pair.name)["mask"],
                                                           "data.calibration": params.data.dir / "calibration.parquet"})
