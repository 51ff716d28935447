"""`viasd` command line: one thin subcommand per stage. Library errors a user can cause
(`ViasdError`) are printed as one line, `viasd: error: ...`, with exit status 2."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from .errors import ViasdError

log = logging.getLogger("viasd")


def _float(text: str) -> float:
    try:
        return float(text)  # accepts "inf" to switch a tier off
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _add_generate(sub) -> None:
    from .policy import METHODS, SPEC_CASCADE_RULES
    from .tiers import CONFIDENCES, SCORES

    p = sub.add_parser("generate", help="decode one prompt with any method and print text + statistics",
                       description="Decode one prompt with any method; print the completion and statistics.")
    p.add_argument("--target", required=True, help="target model: local directory or Hugging Face hub id")
    p.add_argument("--draft", help="draft model (every method but ar needs one)")
    p.add_argument("--mask", action="append", default=[], metavar="FILE",
                   help="routing mask JSON ({\"keep_layers\": [...]}); repeat for the N-tier form (smallest first)")
    p.add_argument("--keep-layers", action="append", default=[], metavar="0,2,5",
                   help="slim verifier layers inline, instead of --mask; may be repeated")
    p.add_argument("--independent", metavar="DIR",
                   help="a separately trained intermediate model, used after any masks (the independent ablation)")
    p.add_argument("--method", default="viasd", choices=METHODS)
    p.add_argument("--gamma", type=int, default=4, help="draft block length")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string; may be repeated")
    p.add_argument("--tau-accept", type=_float, action="append", metavar="X",
                   help="tier-1 threshold (inf = off); repeat once per slim verifier for N tiers")
    p.add_argument("--tau-slim", type=_float, action="append", metavar="Y",
                   help="tier-2 threshold (inf = off); repeat once per slim verifier for N tiers")
    p.add_argument("--score", default="ratio", choices=sorted(SCORES))
    p.add_argument("--confidence", default="max_prob", choices=sorted(CONFIDENCES))
    p.add_argument("--max-lag", type=int, default=0, help="force a full-model catch-up above this lag (0 = never)")
    p.add_argument("--cache", default="dynamic", choices=["dynamic", "static"], help="KV cache kind (static: preallocated)")
    p.add_argument("--rule", default="opt", choices=SPEC_CASCADE_RULES, help="spec_cascade deferral rule")
    p.add_argument("--alpha", type=float, default=0.1, help="spec_cascade lenience")
    p.add_argument("--gamma-slim", type=int, help="cascade_sd: slim-level tokens per full verification")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N, mps")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--trust-remote-code", action="store_true", help="run model code from the hub (off by default)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", type=Path, help="file holding the prompt text")
    p.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    p.set_defaults(func=_generate)


def _generate(args) -> int:
    from .models import load_models
    from .policy import DecodePolicy
    from .routing import RoutingMask, num_decoder_layers
    from .sampling import SamplingConfig

    if args.prompt_file is not None:
        try:
            prompt = args.prompt_file.read_text()
        except OSError as err:
            raise ViasdError(f"cannot read the prompt file {args.prompt_file}: {err.strerror}") from None
    else:
        prompt = args.prompt
    if not prompt:
        raise ViasdError("the prompt is empty: give some text to continue")
    if args.method != "ar" and not args.draft:
        raise ViasdError(f"method {args.method} needs --draft")
    if args.method in ("viasd", "cascade_sd") and not (args.mask or args.keep_layers or args.independent):
        raise ViasdError(f"method {args.method} needs a slim verifier: pass --mask FILE or --keep-layers 0,2,...")
    tau = {}
    for name in ("tau_accept", "tau_slim"):
        values = getattr(args, name)
        if values:
            tau[name] = values[0] if len(values) == 1 else tuple(values)
    policy = DecodePolicy(
        method=args.method, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
        sampling=SamplingConfig(args.temperature, args.top_k, args.top_p), seed=args.seed,
        stop_strings=tuple(args.stop), score=args.score, confidence=args.confidence, max_lag=args.max_lag,
        cache=args.cache, rule=args.rule, alpha=args.alpha, gamma_slim=args.gamma_slim, **tau,
    )
    draft = args.draft if args.method != "ar" else None
    models = load_models(args.target, draft=draft, device=args.device, dtype=args.dtype,
                         trust_remote_code=args.trust_remote_code)
    if policy.needs_slim:
        n = num_decoder_layers(models.target)
        for path in args.mask:
            models.add_mask(RoutingMask.from_json(path, n))
        for text in args.keep_layers:
            models.add_mask(RoutingMask.parse(text, n))
        if args.independent:  # after the masks: the independent model is the largest level
            models.add_independent_from(args.independent, args.device, args.dtype, args.trust_remote_code)
    result = models.generate(prompt, policy)
    if args.json:
        print(json.dumps({"text": result.text, "token_ids": result.token_ids, "stats": result.stats.as_dict()}))
    else:
        print(result.text)
        print("---", file=sys.stderr)
        print(result.stats.summary(), file=sys.stderr)
    return 0


def _add_params(p) -> None:
    p.add_argument("--params", type=Path, default=Path("params.yaml"), help="the study's parameter file")
    p.add_argument("--config", type=Path, action="append", default=[], metavar="FILE",
                   help="a file merged over --params (e.g. config/smoke.yaml); may be repeated")
    p.add_argument("--no-track", action="store_true", help="do not record the run in MLflow")


def _experiment(params) -> str:
    return f"viasd-{params.study['name']}"


def _track(args, params, stage: str, run_name: str, run_params: dict, metrics: dict, tags: dict | None = None,
           artifacts=(), series=None, inputs: dict | None = None) -> None:
    """Record the stage run in MLflow (after its files are written; a failure only warns)."""
    if args.no_track or metrics.get("up_to_date"):
        return
    from .tracking import input_hashes, record_run

    tags = {"stage": stage, "pair": params.pair(getattr(args, "pair", None)).name, **(tags or {})}
    tags.update(input_hashes(inputs or {}))
    record_run(args.params.resolve().parent, _experiment(params), run_name, run_params, metrics, tags, artifacts,
               series)


def _stage_parser(sub, name: str, help: str, func):
    """A subcommand of the study: reads params.yaml (+ --config overrides), records itself in MLflow."""
    p = sub.add_parser(name, help=help)
    _add_params(p)
    p.set_defaults(func=func)
    return p


def _load_params(args):
    from . import config

    return config.load(args.params, args.config)


def _add_prepare_data(sub) -> None:
    _stage_parser(sub, "prepare-data", "stdlib corpus splits, tokenizer, calibration set, task prompts", _prepare_data)


def _prepare_data(args) -> int:
    from .data.prepare import prepare_data

    params = _load_params(args)
    out = prepare_data(params)
    manifest = json.loads((out / "manifest.json").read_text())
    _track(args, params, "prepare_data", "prepare_data", {"data": params.raw["data"], "tasks": params.raw["tasks"]},
           {f"tokens_{k}": v for k, v in manifest["tokens"].items()} | {"vocab_size": manifest["vocab_size"]},
           {"python_version": manifest["python_version"], "pair": "-"}, [out / "manifest.json"])
    print(out)
    return 0


def _add_train_model(sub) -> None:
    from .training.train import ROLES

    p = _stage_parser(sub, "train-model", "train one model of the default family (resumes from a checkpoint)",
                      _train_model)
    p.add_argument("--role", required=True, choices=ROLES)


def _train_model(args) -> int:
    from .training.train import read_training_report, train_model

    params = _load_params(args)
    out = train_model(params, args.role)
    report = read_training_report(out)
    _track(args, params, "train_model", f"train_model/{args.role}",
           {"arch": vars(params.family.arch(args.role)), "train": vars(params.train), "seed": params.seed},
           {k: report[k] for k in ("parameters", "steps", "train_seconds", "tokens_per_second", "test_nll",
                                   "test_perplexity", "final_loss")},
           {"role": args.role, "pair": params.family.name}, [out / "training.json"],
           {"train_loss": report["loss_curve"]}, inputs={"data.manifest": params.data.dir / "manifest.json"})
    print(json.dumps({k: report[k] for k in ("role", "parameters", "steps", "train_seconds", "test_nll",
                                             "test_perplexity")}))
    return 0


def _add_pair(p) -> None:
    p.add_argument("--pair", help="a pair of study.pairs (default: the first)")


def _scalars(data: dict) -> dict:
    return {k: v for k, v in data.items() if not isinstance(v, (dict, list, str))}


def _add_decode(sub) -> None:
    p = _stage_parser(sub, "decode", "decode a task's test prompts with one run of the study grid (vs ar)", _decode)
    _add_pair(p)
    p.add_argument("--task", required=True)
    p.add_argument("--run", required=True, help="a method, or method-ablation, e.g. viasd-mask_random")
    p.add_argument("--limit", type=int, help="decode only the first N examples")


def _decode(args) -> int:
    from .stages.decode_stage import decode_paths, run_decode_stage

    params, pair, spec = _grid_cell(args)
    summary = run_decode_stage(params, pair.name, args.task, spec.name, args.limit)
    paths = decode_paths(params, pair.name, args.task, spec.name)
    _track(args, params, "decode", f"decode/{pair.name}/{args.task}/{spec.name}",
           {"policy": summary["policy"], "split": summary["split"], "examples": summary["examples"],
            "slim": summary["slim"]},
           _scalars(summary) | {f"passes.{k}": v for k, v in summary["passes"].items()},
           _cell_tags(pair, args.task, spec), [paths["summary"]], inputs=_input_files(params, pair, args.task, spec.name))
    print(json.dumps({k: summary[k] for k in ("pair", "task", "run", "examples", "new_tokens", "rejection_rate",
                                              "acceptance_rate", "mean_accepted_length", "speedup_vs_ar")}))
    return 0


def _grid_cell(args):
    """Parameters, pair and run of a `--pair/--task/--run` command."""
    from .stages.runs import parse_run

    params = _load_params(args)
    try:
        spec = parse_run(args.run)
    except ValueError as err:
        raise ViasdError(f"--run {err}") from None
    return params, params.pair(args.pair), spec


def _cell_tags(pair, task: str, spec) -> dict:
    return {"pair": pair.name, "task": task, "method": spec.method, "ablation": spec.ablation or "none",
            "run": spec.name}


def _input_files(params, pair, task: str, run: str | None = None) -> dict:
    """A stage's inputs, for the `dvc_md5.*` tags of its MLflow run."""
    from .stages.decode_stage import run_inputs

    files = {"data.manifest": params.data.dir / "manifest.json"}
    if pair.trained:
        files.update({f"model.{r}": params.model_dir(r) for r in ("target", "draft")})
    if run is not None:
        files.update(run_inputs(params, pair.name, task, run))
    return files


def _add_evaluate(sub) -> None:
    p = _stage_parser(sub, "evaluate", "the task's quality metrics for one decode output", _evaluate)
    _add_pair(p)
    p.add_argument("--task", required=True)
    p.add_argument("--run", required=True)


def _evaluate(args) -> int:
    from .stages.evaluate_stage import eval_path, run_evaluate_stage

    params, pair, spec = _grid_cell(args)
    out = run_evaluate_stage(params, pair.name, args.task, spec.name)
    _track(args, params, "evaluate", f"evaluate/{pair.name}/{args.task}/{spec.name}",
           {"policy": out["policy"], "split": out["split"], "examples": out["examples"]},
           _scalars(out) | {f"quality.{k}": v for k, v in out["quality"].items()}
           | {f"passes.{k}": v for k, v in out["passes"].items()}
           | {f"accepted_by_tier.{k}": out[k] for k in ("accepted_direct", "accepted_slim", "accepted_full",
                                                        "regenerated_slim", "rejected_full")},
           _cell_tags(pair, args.task, spec), [eval_path(params, pair.name, args.task, spec.name)])
    print(json.dumps({"run": spec.name, "quality": out["quality"], "speedup_vs_ar": out["speedup_vs_ar"]}))
    return 0


def _add_report(sub) -> None:
    _stage_parser(sub, "report", "tables (markdown + CSV) and plots of every evaluated run", _report)


def _report(args) -> int:
    from .stages.report_stage import report_paths, run_report_stage

    params = _load_params(args)
    out = run_report_stage(params)
    paths = report_paths(params)
    _track(args, params, "report", "report", {"study": params.study}, {"tables": out["tables"], "runs": out["runs"]},
           {}, list(paths.values()))
    print(paths["summary"])
    return 0


def _add_bench(sub) -> None:
    from .benchmark import HF, OURS

    p = _stage_parser(sub, "bench", "speed side by side: our methods vs transformers generate / assisted generation",
                      _bench)
    _add_pair(p)
    p.add_argument("--task", default="stdlib_continuation", help="prompts from this task's test split")
    p.add_argument("--prompts", type=int, default=8, help="number of prompts")
    p.add_argument("--max-new-tokens", type=int, help="tokens per prompt (default: the task's max_new_tokens)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up round")
    p.add_argument("--gamma", type=int, help="draft block length (default: decode.gamma)")
    p.add_argument("--methods", default=",".join(HF + OURS), help="comma-separated, from: " + ", ".join(HF + OURS))
    p.add_argument("--cache", default="dynamic", choices=["dynamic", "static"],
                   help="KV cache of our methods: dynamic (grows by concatenation) or static (preallocated)")
    p.add_argument("--sweep", metavar="KIND=V1,V2,...",
                   help="scaling run instead: gamma=1,2,4,8 | length=64,128,256,512 | prompt=32,128,384")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])


def _bench(args) -> int:
    from .stages.bench_stage import bench_paths, run_bench_stage, run_sweep

    params = _load_params(args)
    for name, value in (("--prompts", args.prompts), ("--repeats", args.repeats)):
        if value < 1:
            raise ViasdError(f"{name} must be at least 1, got {value}")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    pair = params.pair(args.pair)
    if args.sweep:
        kind, _, values = args.sweep.partition("=")
        try:
            numbers = [int(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise ViasdError(f"--sweep {args.sweep}: the values must be integers, e.g. gamma=1,2,4") from None
        if not numbers:
            raise ViasdError(f"--sweep {args.sweep}: give values, e.g. {kind or 'gamma'}=1,2,4")
        out = run_sweep(params, pair.name, args.task, kind, numbers, args.prompts, args.max_new_tokens, args.repeats,
                        args.gamma, args.device, args.dtype, methods if args.methods != _add_bench_default() else None,
                        cache=args.cache)
        for point in out["points"]:
            print(json.dumps(point))
        print(bench_paths(params, pair.name, args.task, kind)["json"])
        return 0
    result = run_bench_stage(params, pair.name, args.task, methods, args.prompts, args.max_new_tokens, args.repeats,
                             args.gamma, args.device, args.dtype, cache=args.cache)
    for name, row in result["methods"].items():
        tps = row["tokens_per_second"]
        print(f"{name:18s} {tps['median']:8.1f} tok/s  (min {tps['min']:.1f}, max {tps['max']:.1f})  "
              f"acceptance {row['acceptance_rate'] if row['acceptance_rate'] is None else round(row['acceptance_rate'], 3)}")
    print(json.dumps({"ratios": result["ratios"],
                      "efficiency": {k: v["efficiency"] for k, v in result["efficiency"].items()}}))
    paths = bench_paths(params, pair.name, args.task)
    _track(args, params, "bench", f"bench/{pair.name}/{args.task}",
           {k: result[k] for k in ("prompts", "max_new_tokens", "gamma", "repeats", "device", "dtype", "cache")},
           {f"ratio.{k}": v for k, v in result["ratios"].items()}
           | {f"tokens_per_second.{k}": v["tokens_per_second"]["median"] for k, v in result["methods"].items()}
           | {f"efficiency.{k}": v["efficiency"] for k, v in result["efficiency"].items()},
           {"task": args.task}, [paths["json"], paths["md"]])
    print(paths["json"])
    return 0


def _add_bench_default() -> str:
    from .benchmark import HF, OURS

    return ",".join(HF + OURS)


def _add_resolve_params(sub) -> None:
    p = sub.add_parser("resolve-params", help="write params.yaml merged with --config files (e.g. for dvc repro)")
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--config", type=Path, action="append", default=[], metavar="FILE")
    p.add_argument("-o", "--out", type=Path, help="write here (default: stdout)")
    p.set_defaults(func=_resolve_params)


def _resolve_params(args) -> int:
    import yaml

    from . import config
    from .io import write_text

    raw = config.resolve(args.params, args.config)
    text = "# resolved by `viasd resolve-params`: " + " + ".join(map(str, [args.params, *args.config])) + "\n"
    text += yaml.safe_dump(raw, sort_keys=False)
    if args.out:
        write_text(args.out, text)
    else:
        sys.stdout.write(text)
    return 0


def _add_tracking_init(sub) -> None:
    _stage_parser(sub, "tracking-init", "create the MLflow store and the study's experiment (before parallel jobs)",
                  _tracking_init)


def _tracking_init(args) -> int:
    from .tracking import init_store

    params = _load_params(args)
    if not args.no_track:
        print(init_store(args.params.resolve().parent, _experiment(params)))
    return 0


def _add_dimr_search(sub) -> None:
    p = _stage_parser(sub, "dimr-search", "search the routing mask of the slim verifier (resumable)", _dimr_search)
    _add_pair(p)
    p.add_argument("--cost", choices=["path", "target"], help="search only with this cost function (default: "
                   "dimr.cost and any other a cost_<fn> run of study.runs needs, saved as cost-<fn>.json)")


def _dimr_search(args) -> int:
    from .stages.dimr_stage import grid_costs

    params = _load_params(args)
    pair = params.pair(args.pair)
    for cost in [args.cost] if args.cost else grid_costs(params):
        _dimr_search_one(args, params, pair, cost)
    return 0


def _dimr_search_one(args, params, pair, cost: str) -> None:
    from .stages.dimr_stage import mask_paths, run_dimr_stage

    out = run_dimr_stage(params, pair=pair, cost=cost)
    paths = mask_paths(params, pair.name, out["cost_fn"])
    trace = [json.loads(line) for line in paths["trace"].read_text().splitlines()]
    _track(args, params, "dimr_search", f"dimr_search/{pair.name}/{out['cost_fn']}", out["config"],
           {"up_to_date": out.get("up_to_date", False)} | {k: out[k] for k in ("cost", "best_random_cost", "trials", "search_seconds", "reference_seconds",
                                "forward_passes", "budget_layers")},
           {"keep_layers": ",".join(map(str, out["keep_layers"])), "cost_fn": out["cost_fn"]},
           [p for k, p in paths.items() if k != "storage"],
           {"trial_cost": [t["cost"] for t in sorted(trace, key=lambda t: t["number"])]},
           inputs=_input_files(params, pair, "") | {"data.calibration": params.data.dir / "calibration.parquet"})
    print(json.dumps({k: out[k] for k in ("cost_fn", "keep_layers", "cost", "best_random_cost", "trials",
                                          "search_seconds")}))


def _add_tune_thresholds(sub) -> None:
    p = _stage_parser(sub, "tune-thresholds", "tune VIA-SD's tau_accept, tau_slim, gamma and rules on a dev split",
                      _tune_thresholds)
    _add_pair(p)
    p.add_argument("--task", help="default: thresholds.task of params.yaml")


def _tune_thresholds(args) -> int:
    from .stages.dimr_stage import mask_paths
    from .stages.thresholds_stage import run_thresholds_stage, threshold_paths

    params = _load_params(args)
    pair = params.pair(args.pair)
    out = run_thresholds_stage(params, args.task, pair=pair)
    paths = threshold_paths(params, out["task"], pair.name)
    trace = sorted((json.loads(line) for line in paths["trace"].read_text().splitlines()), key=lambda t: t["number"])
    _track(args, params, "tune_thresholds", f"tune_thresholds/{pair.name}/{out['task']}",
           {k: out[k] for k in ("gamma", "tau_accept", "tau_slim", "score", "confidence", "max_quality_drop")}
           | {"search": out["signature"]["config"]},
           {**out["dev"], "cost_vs_sd": out["cost_vs_sd"], "trials": out["trials"],
            "up_to_date": out.get("up_to_date", False)}, {"task": out["task"]}, [paths["json"], paths["plot"]],
           {"trial_cost_per_token": [t["cost_per_token"] for t in trace],
            "trial_quality_drop": [t["quality_drop"] for t in trace]},
           inputs=_input_files(params, pair, out["task"]) | {"mask": mask_paths(params, pair.name)["mask"],
                                                             "data.dev": params.data.dir / "tasks" / out["task"] /
                                                             "dev.jsonl"})
    print(json.dumps({k: out[k] for k in ("gamma", "tau_accept", "tau_slim", "score", "confidence", "dev",
                                          "cost_vs_sd")}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="viasd", description="VIA-SD: three-tier speculative decoding")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_prepare_data(sub)
    _add_train_model(sub)
    _add_decode(sub)
    _add_dimr_search(sub)
    _add_tune_thresholds(sub)
    _add_evaluate(sub)
    _add_report(sub)
    _add_bench(sub)
    _add_resolve_params(sub)
    _add_tracking_init(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return args.func(args)
    except ViasdError as err:
        print(f"viasd: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
