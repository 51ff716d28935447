"""`viasd bench`: speed side by side against transformers, and the scaling sweeps."""

from __future__ import annotations

import argparse
import json
import logging

from ..decoding.policy import CACHE_KINDS
from ..errors import ViasdError
from .common import add_generation_args, add_pair, load_params, stage_parser, track

log = logging.getLogger(__name__)


def add_bench(sub) -> None:
    from ..bench.methods import DEFAULT_TREE, FEATURE_VARIANTS, HF, SELF_VARIANTS, TREE_VARIANTS, VIASD_VARIANTS
    from ..decoding.policy import METHODS

    p = stage_parser(sub, "bench", "speed side by side: our methods vs transformers generate / assisted generation",
                      _bench)
    add_pair(p)
    p.add_argument("--task", default="stdlib_continuation", help="prompts from this task's test split")
    p.add_argument("--prompts", type=int, default=8, help="number of prompts")
    p.add_argument("--max-new-tokens", type=int, help="tokens per prompt (default: the task's max_new_tokens)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up round")
    p.add_argument("--gamma", type=int, help="draft block length of sd, cascade_sd and spec_cascade (default: SD's best "
                   "gamma on dev, from the threshold search; decode.sd_gamma when it is a number)")
    p.add_argument("--methods", help="comma-separated (default: all; a sweep: hf_ar,ar,sd,viasd), from: "
                   + ", ".join(HF + METHODS + VIASD_VARIANTS + FEATURE_VARIANTS + SELF_VARIANTS + TREE_VARIANTS)
                   + " (the -drafter_feature ones draft with the family's feature drafter, `viasd train-drafter`; the "
                   "-drafter_self ones with the target's first layers, models.self_drafter or --draft-layers; the "
                   "sd-tree ones draft a tree, --tree-nodes and --tree-top-k)")
    p.add_argument("--draft-layers", metavar="0,1",
                   help="the target's layers that draft for the -drafter_self methods instead of models.self_drafter's "
                        "(then without the router and thresholds the study fitted for those; self-speculation; under viasd the "
                        "pair's slim, deeper, is the middle tier)")
    p.add_argument("--cache", choices=CACHE_KINDS,
                   help="KV cache of our methods (default: decode.cache): inplace (written in place, attention over "
                        "the filled prefix), dynamic (transformers' DynamicCache) or static (transformers' StaticCache)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile our methods' models (default: decode.compile); compiled in the warm-up round")
    p.add_argument("--reuse", action=argparse.BooleanOptionalAction, default=None,
                   help="viasd: the slim's shared layers computed once for the full model too (default: decode.reuse)")
    add_generation_args(p)
    p.add_argument("--sweep", metavar="KIND=V1,V2,...",
                   help="scaling run instead: gamma=1,2,4,8 | length=64,128,256,512 | prompt=32,128,384 | "
                        "position=100,500,1000 | tree=4,8,16 (the sd-tree methods' nodes); or `frontier`: "
                        "tokens/s vs fidelity and the task metric for ar, sd, "
                        "viasd over its tier thresholds and spec_cascade over its lenience")
    p.add_argument("--batch", metavar="B1,B2,...",
                   help="throughput and latency against batch size instead, e.g. 1,2,4,8,16: hf_ar (transformers' batched "
                        "generate), ar, sd and viasd (or --methods) decode the prompts at most B at a time")
    p.add_argument("--tree-nodes", type=int, default=DEFAULT_TREE["tree_nodes"],
                   help="the sd-tree methods: the most draft-tree nodes the full model verifies per block")
    p.add_argument("--tree-top-k", type=int, default=DEFAULT_TREE["tree_top_k"],
                   help="the sd-tree methods: children of each expanded node, and nodes expanded per depth")
    p.add_argument("--tree-depth", type=int,
                   help="the sd-tree methods: the tree's depth (default: --gamma, the chains' block length)")
    p.add_argument("--split", choices=["test", "dev"], default="test",
                   help="the prompts' split: test to report; dev where a choice is being made (e.g. whether a tree pays)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])



# bench methods that took the study's run names (`viasd-oracle`, ...): the old spellings still work, with a warning
RENAMED = {"viasd_oracle": "viasd-oracle", "viasd_oracle_budget": "viasd-oracle_budget", "viasd_rules": "viasd-rules"}


def renamed(name: str) -> str:
    """`name`, or its new spelling (with a deprecation warning) when it is an old bench method name."""
    if name in RENAMED:
        log.warning("bench method %r is now %r, as the study's run; the old name will go", name, RENAMED[name])
        return RENAMED[name]
    return name


def _bench(args) -> int:
    from ..bench.command import bench_record, default_methods, run_bench_stage
    from ..bench.sweeps import run_sweep

    params = load_params(args)
    for name, value in (("--prompts", args.prompts), ("--repeats", args.repeats)):
        if value < 1:
            raise ViasdError(f"{name} must be at least 1, got {value}")
    chosen = [renamed(m.strip()) for m in args.methods.split(",") if m.strip()] if args.methods else None
    pair = params.pair(args.pair)
    engine = {"cache": args.cache, "compile": args.compile, "reuse": args.reuse,  # None: decode.*
              "generation_config": args.generation_config, "generation": dict(args.generation) or None}
    if args.batch is not None:
        return _batch(args, params, pair.name, chosen, engine)
    if args.sweep == "frontier":
        out = run_sweep(params, pair.name, args.task, "frontier", [], args.prompts, args.max_new_tokens, args.repeats,
                        args.gamma, args.device, args.dtype, engine=engine, draft_layers=args.draft_layers)
        for point in out["points"]:
            print(json.dumps({k: point.get(k) for k in ("name", "tokens_per_second", "fidelity", "task_score",
                                                        "task_drop")}))
        print(out["files"]["json"])
        return 0
    if args.sweep:
        kind, _, values = args.sweep.partition("=")
        try:
            numbers = [int(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise ViasdError(f"--sweep {args.sweep}: the values must be integers, e.g. gamma=1,2,4") from None
        if not numbers:
            raise ViasdError(f"--sweep {args.sweep}: give values, e.g. {kind or 'gamma'}=1,2,4")
        out = run_sweep(params, pair.name, args.task, kind, numbers, args.prompts, args.max_new_tokens, args.repeats,
                        args.gamma, args.device, args.dtype, chosen, engine=engine, draft_layers=args.draft_layers,
                        tree_top_k=args.tree_top_k, split=args.split)
        for point in out["points"]:
            print(json.dumps(point))
        print(out["files"]["json"])
        return 0
    if args.tree_nodes < 1 or args.tree_top_k < 1 or (args.tree_depth is not None and args.tree_depth < 1):
        raise ViasdError(f"--tree-nodes, --tree-top-k and --tree-depth must be at least 1, got {args.tree_nodes}, "
                         f"{args.tree_top_k} and {args.tree_depth}")
    result = run_bench_stage(params, pair.name, args.task, chosen or default_methods(params), args.prompts,
                             args.max_new_tokens, args.repeats, args.gamma, args.device, args.dtype, engine=engine,
                             draft_layers=args.draft_layers,
                             tree={"tree_nodes": args.tree_nodes, "tree_top_k": args.tree_top_k,
                                   **({"gamma": args.tree_depth} if args.tree_depth else {})}, split=args.split)
    for name, row in result["methods"].items():
        tps = row["tokens_per_second"]
        accepted = row["mean_accepted_length"]
        print(f"{name:18s} {tps['median']:8.1f} tok/s  (min {tps['min']:.1f}, max {tps['max']:.1f})  "
              f"acceptance {row['acceptance_rate'] if row['acceptance_rate'] is None else round(row['acceptance_rate'], 3)}"
              f"  accepted/block {accepted if accepted is None else round(accepted, 2)}")
    print(json.dumps({"quality": {k: v["quality"] for k, v in result["methods"].items()},
                      "ratios_model": result["ratios_model"]}))
    print(json.dumps({"intervals": {k: [round(v[e], 4) if v[e] is not None else None for e in ("ratio", "low", "high")]
                                    for k, v in result["intervals"].items() if v}}))
    print(json.dumps({"ratios": result["ratios"], "ratio_rounds": result["ratio_rounds"],
                      "efficiency": {k: v["efficiency"] for k, v in result["efficiency"].items()}}))
    for tie in result["numerical_ties"]:
        print(f"numerical tie: {tie['method']} parts from {tie['reference']} on prompt {tie['prompt']} at position "
              f"{tie['position']} (logit gap {tie['logit_gap']:.3g}, rounding noise {tie['noise']:.3g})")
    track(args, params, bench_record(result))
    print(result["files"]["json"])
    return 0


def _batch(args, params, pair: str, methods, engine) -> int:
    from ..bench.sweeps import batch_record, run_batch_sweep

    if args.sweep:
        raise ViasdError("--batch and --sweep are two different runs: give one")
    try:
        sizes = [int(v) for v in args.batch.split(",") if v.strip()]
    except ValueError:
        raise ViasdError(f"--batch {args.batch}: the batch sizes must be integers, e.g. 1,2,4,8") from None
    if not sizes or min(sizes) < 1:
        raise ViasdError(f"--batch {args.batch}: give batch sizes of at least 1, e.g. 1,2,4,8")
    out = run_batch_sweep(params, pair, args.task, sizes, args.prompts, args.max_new_tokens, args.repeats, args.gamma,
                          args.device, args.dtype, methods, engine=engine, draft_layers=args.draft_layers)
    for row in out["rows"]:
        print(json.dumps({"batch": row["batch"],
                          **{n: round(m["tokens_per_second"], 1) for n, m in row["methods"].items()},
                          **{k: r and round(r["ratio"], 3) for k, r in row["ratios"].items()}}))
    track(args, params, batch_record(out))
    print(out["files"]["json"])
    return 0
