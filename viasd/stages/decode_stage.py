"""`viasd decode --pair P --task T --run R`: one cell of the study grid on the task's test split.

Every run but `ar` decodes each prompt twice, with its method and with greedy `ar`, alternating,
so `speedup_vs_ar` is a ratio measured side by side in the same process, and agreement with the
target's greedy output is exact. Outputs (named by pair, task and run):
  reports/decode/<pair>/<task>/<run>.jsonl   one row per example: tokens, text, statistics, ar tokens
  reports/decode/<pair>/<task>/<run>.json    summed statistics, speedup vs ar, the policy used
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

from ..config import Pair, Params
from ..errors import ViasdError
from ..policy import DecodePolicy
from .dimr_stage import mask_paths
from .runs import RunSpec, parse_run
from .thresholds_stage import threshold_paths


class StudyInputError(ViasdError):
    """A stage's input (mask, thresholds, decode output) has not been produced yet."""


def decode_paths(params: Params, pair: str, task: str, run: str) -> dict:
    base = params.reports_dir / "decode" / pair / task
    return {"rows": base / f"{run}.jsonl", "summary": base / f"{run}.json"}


def run_inputs(params: Params, pair: str, task: str, run: str | RunSpec) -> dict[str, Path]:
    """The files a run reads besides the pair's models and the task's prompts."""
    spec = parse_run(run) if isinstance(run, str) else run
    inputs = {}
    kind = spec.mask_kind
    if kind == "main":
        inputs["mask"] = mask_paths(params, pair)["mask"]
    elif kind is not None and kind.startswith("cost_"):
        inputs["mask"] = mask_paths(params, pair, kind[len("cost_"):])["mask"]
    elif kind is not None:
        inputs["mask"] = mask_paths(params, pair)[kind]
    if spec.method == "viasd":
        inputs["thresholds"] = threshold_paths(params, task, pair)["json"]
    return inputs


def _read_json(path: Path, what: str) -> dict:
    if not path.exists():
        raise StudyInputError(f"{what} {path} does not exist: run the stage that writes it first")
    return json.loads(path.read_text())


def run_policy(params: Params, pair: str, task: str, run: str | RunSpec) -> DecodePolicy:
    """The decoding policy of one grid cell: params.yaml's `decode` section, the tuned thresholds for
    `viasd`, and the run's ablation on top."""
    spec = parse_run(run) if isinstance(run, str) else run
    section = params.raw["decode"]
    cascade = section.get("spec_cascade") or {}
    fields = {"method": spec.method, "gamma": section["gamma"], "gamma_slim": section.get("gamma_slim"),
              "rule": cascade.get("rule", "opt"), "alpha": cascade.get("alpha", 0.1),
              "max_lag": section.get("max_lag", 0), "seed": params.seed, "cache": section.get("cache", "dynamic"),
              "max_new_tokens": params.tasks.get(task, {}).get("max_new_tokens", 128)}
    if spec.method == "viasd":
        tuned = _read_json(run_inputs(params, pair, task, spec)["thresholds"], "the tuned thresholds")
        fields.update({k: tuned[k] for k in ("gamma", "tau_accept", "tau_slim", "score", "confidence")})
    if spec.ablation == "no_tier2":
        fields["tau_slim"] = math.inf
    if spec.gamma is not None:
        fields["gamma"] = spec.gamma
    return DecodePolicy(**fields)


def load_run_models(params: Params, pair: Pair, spec: RunSpec, inputs: dict):
    """Target + draft of the pair, and the run's slim verifier (a routed mask or the independent model)."""
    from ..models import load_models

    if "mask" in inputs:
        _read_json(inputs["mask"], "the routing mask")  # a missing mask names the stage that writes it
    independent = None
    if spec.routed and spec.ablation == "independent":
        if not pair.independent:
            raise StudyInputError(f"pair {pair.name} has no independent model (models.hub_pairs.{pair.name}.independent)")
        independent = pair.independent
    return load_models(pair.target, draft=pair.draft if spec.method != "ar" else None,
                       masks=[inputs["mask"]] if "mask" in inputs else [], device=params.device, dtype=pair.dtype,
                       trust_remote_code=pair.trust_remote_code, independent=independent)


def run_decode_stage(params: Params, pair_name: str, task: str, run: str, limit: int | None = None,
                     progress: bool = True) -> dict:
    """Decode the task split with one run of the grid; writes the rows and the summary, returns the summary."""
    from ..evaluation import decode_against_ar, decode_examples
    from ..io import write_json, write_jsonl
    from ..tasks import get_task, load_examples

    spec = parse_run(run)
    pair = params.pair(pair_name)
    split = params.raw["decode"]["split"]
    task_spec = get_task(task)
    examples = load_examples(params.data.dir, task, split)[:limit]
    inputs = run_inputs(params, pair.name, task, spec)
    policy = run_policy(params, pair.name, task, spec)
    models = load_run_models(params, pair, spec, inputs)
    if spec.method == "ar":
        rows, stats = decode_examples(models, examples, policy, task_spec, progress)
        ar_stats = stats
    else:
        rows, stats, ar_stats = decode_against_ar(models, examples, policy, task_spec, progress)
    summary = stats.as_dict()
    summary.update({
        "pair": pair.name, "task": task, "run": spec.name, "method": spec.method, "ablation": spec.ablation or "none",
        "split": split, "examples": len(rows), "ar_wall_time_s": ar_stats.wall_time_s,
        "ar_tokens_per_second": ar_stats.tokens_per_second,
        "speedup_vs_ar": (ar_stats.wall_time_s / stats.wall_time_s) if stats.wall_time_s else None,
        "policy": {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v))
                   for k, v in asdict(policy).items() if k not in ("sampling", "eos_token_ids", "stop_strings")},
        "inputs": {k: str(v) for k, v in inputs.items()},
        "slim": "independent" if spec.ablation == "independent" else
                (json.loads(inputs["mask"].read_text())["keep_layers"] if "mask" in inputs else None),
    })
    paths = decode_paths(params, pair.name, task, spec.name)
    write_jsonl(paths["rows"], rows)
    write_json(paths["summary"], summary)  # last: the summary marks a finished decode
    return summary
