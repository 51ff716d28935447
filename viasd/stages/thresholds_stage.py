"""`viasd tune-thresholds`: VIA-SD thresholds for the pair and task, on the dev split.

Outputs: models/thresholds/<pair>-<task>.json (what the decode stage reads), .trace.jsonl and
reports/thresholds/<pair>-<task>.png (speed-quality trade-off); the resumable Optuna study lives in
models/optuna/thresholds-<pair>-<task>.db.
Nothing is written when no trial meets the quality constraint.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict

from ..config import Pair, Params
from ..io import write_json, write_jsonl
from ..search.plots import speed_quality
from ..search.thresholds import DevSet, ThresholdConfig, tune_thresholds
from ..tasks import get_task, load_examples
from .dimr_stage import mask_paths, optuna_storage, study_name

log = logging.getLogger(__name__)


def threshold_config(params: Params) -> ThresholdConfig:
    section = {k: tuple(v) if isinstance(v, list) else v for k, v in params.raw.get("thresholds", {}).items()
               if k not in ("task", "dev_prompts")}
    return ThresholdConfig(seed=params.seed, **section)


def threshold_paths(params: Params, task: str, pair: str | None = None) -> dict:
    name = f"{pair or params.pair().name}-{task}"
    base = params.models_dir / "thresholds"
    return {"json": base / f"{name}.json", "trace": base / f"{name}.trace.jsonl",
            "storage": params.models_dir / "optuna" / f"thresholds-{name}.db",
            "plot": params.reports_dir / "thresholds" / f"{name}.png"}


def run_thresholds_stage(params: Params, task: str | None = None, progress: bool = True,
                         pair: Pair | None = None) -> dict:
    from ..models import load_models
    from ..routing import RoutingMask

    pair = pair or params.pair()
    section = params.raw.get("thresholds", {})
    task = task or section.get("task", "stdlib_continuation")
    cfg = threshold_config(params)
    paths = threshold_paths(params, task, pair.name)
    mask_file = mask_paths(params, pair.name)["mask"]
    signature = {"config": asdict(cfg), "task": task, "dev_prompts": section.get("dev_prompts"),
                 "mask": json.loads(mask_file.read_text())["keep_layers"] if mask_file.exists() else None}
    signature = json.loads(json.dumps(signature))  # as it reads back from the file
    if paths["json"].exists() and json.loads(paths["json"].read_text()).get("signature") == signature:
        log.info("thresholds %s are up to date; nothing to do", paths["json"])
        return {**json.loads(paths["json"].read_text()), "up_to_date": True}
    models = load_models(pair.target, draft=pair.draft, device=params.device, dtype=pair.dtype,
                         trust_remote_code=pair.trust_remote_code)
    models.add_mask(RoutingMask.from_json(mask_file, models.target.config.num_hidden_layers))
    examples = load_examples(params.data.dir, task, "dev")[: section.get("dev_prompts")]
    max_new = params.tasks.get(task, {}).get("max_new_tokens", 128)
    dev = DevSet(models, examples, max_new, get_task(task).stop_strings)
    out = tune_thresholds(dev, cfg, optuna_storage(params, paths["storage"]), study_name(f"thresholds-{pair.name}-{task}", signature),
                          progress)
    best = out["best"]
    result = {
        "gamma": best["gamma"], "tau_accept": best["tau_accept"], "tau_slim": best["tau_slim"],
        "score": best["score"], "confidence": best["confidence"], "task": task, "pair": pair.name,
        "mask": signature["mask"], "dev": {k: best[k] for k in ("cost_per_token", "wall_per_token", "agreement",
                                                                "quality_drop", "rejection_rate", "acceptance_rate",
                                                                "block_escalation_rate", "speedup_model_vs_ar")},
        "sd_same_gamma": {k: out["sd"][k] for k in ("cost_per_token", "wall_per_token", "rejection_rate",
                                                     "acceptance_rate")},
        "cost_vs_sd": best["cost_per_token"] / out["sd"]["cost_per_token"],
        "max_quality_drop": cfg.max_quality_drop, "trials": len(out["trials"]), "pass_cost_s": out["pass_cost"],
        "ar_seconds_per_token": out["ar_seconds_per_token"], "signature": signature,
    }
    write_jsonl(paths["trace"], out["trials"])
    speed_quality(out["trials"], best, cfg.max_quality_drop, paths["plot"],
                  f"VIA-SD thresholds, {pair.name} on {task} (dev)")
    write_json(paths["json"], result)
    return result
