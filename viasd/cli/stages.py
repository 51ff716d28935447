"""The study's stage subcommands (each a thin wrapper of `viasd.stages`), called alike by Snakemake
rules, DVC stages and a person at a shell."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .common import (
    add_grid_cells,
    add_pair,
    experiment,
    grid_cells,
    live_metric,
    load_params,
    record_params,
    stage_parser,
    track,
)


def add_prepare_data(sub) -> None:
    p = stage_parser(sub, "prepare-data", "stdlib corpus splits, tokenizer, calibration set, task prompts", _prepare_data)
    p.add_argument("--only", choices=["corpus", "tasks"],
                   help="corpus: tokenizer, token datasets, calibration set (what training reads); tasks: prompts")
    p.add_argument("--task", action="append", metavar="NAME", help="with --only tasks: this task (repeatable)")
    p.add_argument("--split", choices=["dev", "test"], help="with --only tasks: this split only")


def _prepare_data(args) -> int:
    from ..errors import ViasdError
    from ..stages.prepare_data import run_prepare_corpus, run_prepare_tasks

    if (args.task or args.split) and args.only != "tasks":
        raise ViasdError("--task and --split select prompts: use them with --only tasks")
    params = load_params(args)
    if args.only in (None, "corpus"):
        record_params(args, "prepare_corpus")
    if args.only in (None, "tasks"):
        for task in args.task or params.study.tasks:
            for split in [args.split] if args.split else ["dev", "test"]:
                record_params(args, "prepare_task", task=task, split=split)
    if args.only in (None, "corpus"):
        track(args, params, run_prepare_corpus(params))
    if args.only in (None, "tasks"):
        track(args, params, run_prepare_tasks(params, args.task, args.split))
    print(params.data.dir)
    return 0


def add_train_model(sub) -> None:
    from ..training.train import ROLES

    p = stage_parser(sub, "train-model", "train one model of the default family (resumes from a checkpoint)",
                      _train_model)
    p.add_argument("--role", required=True, choices=ROLES)



def _train_model(args) -> int:
    from ..stages.train_model import run_train_model

    params = load_params(args)
    record_params(args, "train_model", role=args.role)
    live = live_metric(args, "train_loss", every=10)  # the loss while training runs, in the stage's open run
    _, report, record = run_train_model(params, args.role, on_step=live)
    track(args, params, record)
    print(json.dumps({k: report[k] for k in ("role", "parameters", "steps", "train_seconds", "test_nll",
                                             "test_perplexity")}))
    return 0


def add_train_drafter(sub) -> None:
    p = stage_parser(sub, "train-drafter", "train the default family's feature drafter (EAGLE-3-style, on the "
                     "target's shared trunk) for the runs with a drafter_feature ablation", _train_drafter)
    p.add_argument("--drafter", choices=["feature"], default="feature", help="which drafter (one of study.drafters)")


def _train_drafter(args) -> int:
    from ..stages.train_drafter import run_train_drafter

    params = load_params(args)
    record_params(args, "train_drafter", drafter=args.drafter)
    live = live_metric(args, "train_loss", every=10)
    out, report, record = run_train_drafter(params, on_step=live)
    track(args, params, record)
    print(json.dumps({"dir": str(out), **{k: report[k] for k in ("parameters", "steps", "train_seconds",
                                                                  "test_agreement_by_depth")}}))
    return 0


def add_dimr_search(sub) -> None:
    p = stage_parser(sub, "dimr-search", "search the routing mask of the slim verifier (resumable)", _dimr_search)
    add_pair(p)
    p.add_argument("--cost", choices=["path", "target"], help="search only with this cost function (default: "
                   "dimr.cost and any other a cost_<fn> run of study.runs needs, saved as cost-<fn>.json)")
    add_worker(p, "dimr.workers")


def add_worker(p, key: str) -> None:
    p.add_argument("--worker", type=int, metavar="K", help=f"run worker K of {key} (1-based): its share of the "
                   "search's trials on the shared Optuna storage, writing no outputs; the command without --worker "
                   "then picks the result (and runs any trial a lost worker left)")


def worker_of(args, count: int, key: str):
    """The `Worker` of `--worker K` (None without it); one clear error if K is not one of `count`."""
    from ..search.workers import Worker

    if args.worker is None:
        return None
    if not 1 <= args.worker <= count:
        from ..config import ConfigError

        raise ConfigError(f"--worker {args.worker}: {key} is {count}, so K must be in 1..{count}")
    return Worker(args.worker - 1, count)



def _dimr_search(args) -> int:
    from ..stages.dimr_search import grid_searches, run_dimr_stage

    params = load_params(args)
    pair = params.pair(args.pair)
    worker = worker_of(args, params.dimr.workers, "dimr.workers")
    if not args.cost:
        record_params(args, "dimr_search" if worker is None else "dimr_worker", pair=pair.name)
    for overrides in [{"cost": args.cost}] if args.cost else grid_searches(params):
        if worker is not None:
            run_dimr_stage(params, pair=pair, worker=worker, **overrides)
            continue
        _dimr_search_one(args, params, pair, **overrides)
    if worker is not None:
        print(json.dumps({"pair": pair.name, "worker": args.worker, "workers": worker.count}))
    return 0



def _dimr_search_one(args, params, pair, **overrides) -> None:
    from ..stages.dimr_search import run_dimr_stage

    records = []
    out = run_dimr_stage(params, pair=pair, records=records, **overrides)
    track(args, params, records[0])
    print(json.dumps({k: out[k] for k in ("cost_fn", "keep_layers", "cost", "best_random_cost", "trials",
                                          "search_seconds")}))



def add_train_router(sub) -> None:
    p = stage_parser(sub, "train-router", "fit the learned router of the pair's DIMR slim on oracle decodes of the "
                     "calibration set", _train_router)
    add_pair(p)
    p.add_argument("--drafter", choices=["model", "feature", "self"], help="fit only the router of blocks this "
                   "drafter drafts (default: the draft model's, and the feature drafter's / the target's first layers' "
                   "when a viasd-drafter_feature / viasd-drafter_self run is in study.runs)")


def _train_router(args) -> int:
    from ..stages.train_router import router_record, run_router_stage
    from ..study.slims import router_drafters

    params = load_params(args)
    pair = params.pair(args.pair)
    if not args.drafter:
        record_params(args, "train_router", pair=pair.name)
    for drafter in [args.drafter] if args.drafter else router_drafters(params):
        out = run_router_stage(params, pair.name, drafter=drafter)
        track(args, params, router_record(params, out))
        print(json.dumps({"pair": pair.name, "drafter": drafter,
                          **{k: out["metrics"][k] for k in ("rows", "draft_auc", "draft_ece", "slim_auc", "slim_ece")}}))
    return 0


def _slim_name(text: str) -> str:
    from ..study.runs import SLIM_ABLATIONS, parse_run

    try:
        if text in ("main", "rules") or text in SLIM_ABLATIONS or parse_run(f"viasd-{text}").prefix is not None:
            return text
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"unknown slim {text!r}: main, {', '.join(SLIM_ABLATIONS)} or prefix_<n>")


def add_tune_thresholds(sub) -> None:
    from ..study.runs import SLIM_ABLATIONS

    p = stage_parser(sub, "tune-thresholds", "tune VIA-SD's tau_accept, tau_slim, gamma and rules on a dev split",
                      _tune_thresholds)
    add_pair(p)
    p.add_argument("--task", help="default: thresholds.task of params.yaml")
    p.add_argument("--slim", action="append", type=_slim_name,
                   help="main, rules, " + ", ".join(SLIM_ABLATIONS) + ", prefix_<n>: tune for this slim verifier only "
                        "(repeatable; default: main, and with thresholds.per_slim every slim ablation of study.runs)")
    add_worker(p, "thresholds.workers")
    p.add_argument("--search", metavar="NAME", help="run this one search's trials (rules, main or a slim's; the "
                   "first of the stage, rules or main, must be complete before another's), as the command without "
                   "--search would, writing no outputs; that command then finds the study complete and picks "
                   "(thresholds.split_searches)")



def _tune_thresholds(args) -> int:
    from ..config import ConfigError
    from ..decoding.policy import TUNED_FIELDS
    from ..search.workers import PART
    from ..stages.tune_thresholds import run_thresholds_stage

    params = load_params(args)
    pair = params.pair(args.pair)
    worker = worker_of(args, params.thresholds.workers, "thresholds.workers")
    if not args.slim:  # its workers and parts share the search's parameters
        record_params(args, "tune_thresholds", pair=pair.name, task=args.task or params.thresholds.task)
    if args.search is not None:
        if worker is not None:
            raise ConfigError("--search and --worker: a search's part runs it alone; its trials are not shared")
        run_thresholds_stage(params, args.task, pair=pair, slims=args.slim, worker=PART, search=args.search)
        print(json.dumps({"pair": pair.name, "task": args.task or params.thresholds.task, "search": args.search}))
        return 0
    if worker is not None:
        run_thresholds_stage(params, args.task, pair=pair, slims=args.slim, worker=worker)
        print(json.dumps({"pair": pair.name, "task": args.task or params.thresholds.task, "worker": args.worker,
                          "workers": worker.count}))
        return 0
    records = []
    results = run_thresholds_stage(params, args.task, pair=pair, slims=args.slim, records=records)
    for (slim, out), record in zip(results.items(), records):
        track(args, params, record)
        print(json.dumps({"slim": slim} | {k: out[k] for k in (*TUNED_FIELDS, "dev", "cost_vs_sd")}))
    return 0



def add_decode(sub) -> None:
    p = stage_parser(sub, "decode", "decode a task's test prompts with runs of the study grid, side by side with ar",
                     _decode)
    add_grid_cells(p)
    p.add_argument("--limit", type=int, help="decode only the first N examples")



def _decode(args) -> int:
    from ..stages.decode import decode_record, run_decode_stage

    params, pair, specs = grid_cells(args)
    if not args.run and args.limit is None:  # the whole grid cell: what the study's rule runs
        record_params(args, "decode", pair=pair.name, task=args.task)
    summaries = run_decode_stage(params, pair.name, args.task, [s.name for s in specs], args.limit)
    for spec, summary in zip(specs, summaries):  # one MLflow run per grid cell
        track(args, params, decode_record(params, pair.name, args.task, spec, summary))
        print(json.dumps({k: summary[k] for k in ("pair", "task", "run", "examples", "new_tokens", "rejection_rate",
                                                  "acceptance_rate", "mean_accepted_length", "speedup_vs_ar")}))
    return 0



def add_batch_table(sub) -> None:
    p = stage_parser(sub, "batch-table", "the study's speed against batch size: hf_ar, ar, sd and the tuned viasd at "
                     "each of batch_table.sizes on the task's first test prompts", _batch_table)
    add_pair(p)
    p.add_argument("--task", required=True)



def _batch_table(args) -> int:
    from ..stages.batch_table import batch_table_record, run_batch_table_stage

    params, pair, _ = grid_cells(args, runs=["ar"])
    record_params(args, "batch_table", pair=pair.name, task=args.task)
    result = run_batch_table_stage(params, pair.name, args.task)
    track(args, params, batch_table_record(params, pair.name, args.task, result))
    for row in result["rows"]:
        print(json.dumps({"batch": row["batch"], **{f"{k}_tokens_per_second": round(m["tokens_per_second"], 2)
                                                     for k, m in row["methods"].items()},
                          **{k: r and round(r["ratio"], 4) for k, r in row["ratios"].items()}}))
    if result.get("off"):
        print(json.dumps({"pair": pair.name, "task": args.task, "batch_table": "off"}))
    return 0



def add_evaluate(sub) -> None:
    p = stage_parser(sub, "evaluate", "the task's quality metrics for the decode outputs of runs of the study grid",
                     _evaluate)
    add_grid_cells(p)



def _evaluate(args) -> int:
    from ..stages.evaluate import evaluate_record, run_evaluate_stage

    params, pair, specs = grid_cells(args)
    if not args.run:
        record_params(args, "evaluate", pair=pair.name, task=args.task)
    outs = run_evaluate_stage(params, pair.name, args.task, [s.name for s in specs])
    for spec, out in zip(specs, outs):  # one MLflow run per grid cell
        track(args, params, evaluate_record(params, pair.name, args.task, spec, out))
        print(json.dumps({"run": spec.name, "quality": out["quality"], "speedup_vs_ar": out["speedup_vs_ar"]}))
    return 0



def add_report(sub) -> None:
    stage_parser(sub, "report", "tables (markdown + CSV) and plots of every evaluated run", _report)



def _report(args) -> int:
    from ..stages.report import report_record, run_report_stage
    from ..study.paths import report_paths

    params = load_params(args)
    record_params(args, "report")
    out = run_report_stage(params)
    run_id = track(args, params, report_record(params, out))
    if run_id is not None:
        describe_study(args, params, out, run_id)
        register_models(args, params, run_id)
    print(report_paths(params)["summary"])
    return 0


def describe_study(args, params, out: dict, run_id: str) -> None:
    """The study's comparison where the MLflow UI shows it (`study.mlflow_view`): the runs table's saved view of the
    compared runs and the experiment's description; a failure only warns, as tracking does."""
    import logging

    from ..study.mlflow_view import publish_comparison

    try:
        shown = publish_comparison(args.params.resolve().parent, experiment(params), params.study.name,
                                   out["headline"], run_id)
        logging.getLogger(__name__).info("the MLflow view of the compared runs shows %d runs", shown)
    except Exception as err:  # noqa: BLE001 - tracking failures only warn
        logging.getLogger(__name__).warning("the MLflow experiment's description and view were not set: %s", err)


def register_models(args, params, run_id: str) -> None:
    """Each pair as an MLflow model in the report's run, registered by name (`study.registered_model`); a
    failure only warns, as tracking does."""
    import logging

    from ..study.registered_model import log_pair_model
    from ..study.tracking import tracking_uri

    for pair in params.study.pairs:
        try:
            uri = log_pair_model(params, pair, run_id, tracking_uri(args.params.resolve().parent))
            logging.getLogger(__name__).info("registered %s", uri)
        except Exception as err:  # noqa: BLE001 - the study's outputs are written; the model is a convenience
            logging.getLogger(__name__).warning("the MLflow model of pair %s was not logged: %s", pair, err)



def add_resolve_params(sub) -> None:
    p = sub.add_parser("resolve-params", help="write params.yaml merged with --config files (e.g. for dvc repro)")
    p.add_argument("--params", type=Path, default=Path("params.yaml"))
    p.add_argument("--config", type=Path, action="append", default=[], metavar="FILE")
    p.add_argument("-o", "--out", type=Path, help="write here (default: stdout)")
    p.set_defaults(func=_resolve_params)



def _resolve_params(args) -> int:
    import yaml

    from .. import config
    from ..io import write_text

    raw = config.resolve(args.params, args.config)
    text = "# resolved by `viasd resolve-params`: " + " + ".join(map(str, [args.params, *args.config])) + "\n"
    text += yaml.safe_dump(raw, sort_keys=False)
    if args.out:
        write_text(args.out, text)
    else:
        sys.stdout.write(text)
    return 0



def add_tracking_init(sub) -> None:
    p = stage_parser(sub, "tracking-init", "create the MLflow store and the study's experiment (before parallel "
                     "jobs); open or close the parent run of a workflow invocation", _tracking_init)
    p.add_argument("--start-parent", metavar="NAME", help="open a parent run and print its id (Snakemake's onstart)")
    p.add_argument("--end-parent", metavar="RUN_ID", help="close this parent run (onsuccess / onerror)")
    p.add_argument("--status", choices=["FINISHED", "FAILED"], default="FINISHED", help="with --end-parent")



def _tracking_init(args) -> int:
    from ..study.pending_runs import deliver_pending
    from ..study.tracking import close_run, init_store, open_run

    params = load_params(args)
    if args.no_track:
        return 0
    root = args.params.resolve().parent
    deliver_pending(root)  # runs a stage could not record while the store was unreachable
    if args.end_parent:
        close_run(root, args.end_parent, args.status)
    elif args.start_parent:
        print(open_run(root, experiment(params), args.start_parent, {"stage": "study"}) or "")
    else:
        import logging

        from ..study.mlflow_view import compare_view_page

        print(init_store(root, experiment(params)))
        try:
            view = compare_view_page(root, experiment(params))
        except Exception as err:  # noqa: BLE001 - a convenience link: tracking failures only warn
            logging.getLogger(__name__).warning("the saved view of the runs was not looked up: %s", err)
            view = None
        if view:  # a report compared the runs: its saved view
            print(f"the report's comparison of the runs, in `mlflow ui`: {view}")
    return 0
