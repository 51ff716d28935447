"""What every study subcommand shares: --params/--config, the pair and grid cell, MLflow at the boundary."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from ..errors import ViasdError

log = logging.getLogger(__name__)


def add_params(p) -> None:
    p.add_argument("--params", type=Path, default=Path("params.yaml"), help="the study's parameter file")
    p.add_argument("--config", type=Path, action="append", default=[], metavar="FILE",
                   help="a file merged over --params (e.g. config/smoke.yaml); may be repeated")
    p.add_argument("--no-track", action="store_true", help="do not record the run in MLflow")



def experiment(params) -> str:
    return f"viasd-{params.study.name}"



def track(args, params, record) -> str | None:
    """Complete the stage's MLflow run, opened when the stage started (`open_stage_run`), with the stage's
    `StageRecord` (after its files are written; a failure only warns); returns its id (None: not recorded). A
    stage that found its outputs up to date records nothing: its open run is discarded."""
    if args.no_track:
        return None
    from ..study.pending_runs import spool_run
    from ..study.tracking import discard_run, input_hashes, record_children, record_run, tracking_uri

    root = args.params.resolve().parent
    run_id, args.run_id = getattr(args, "run_id", None), None  # completed (or discarded) here, once

    if record.up_to_date:
        if run_id:
            discard_run(root, run_id)
        return None
    tags = {"stage": record.stage, "pair": params.pair(getattr(args, "pair", None)).name, **record.tags}
    tags.update(input_hashes(record.inputs))
    opened = run_id
    run_id = record_run(root, experiment(params), record.name, record.params, record.metrics, tags, record.artifacts,
                        record.series, run_id=run_id, datasets=record.datasets)
    if run_id is None:  # the store did not take it: kept, and delivered by the next command that reaches it
        path = spool_run(root, experiment(params), record.name, record.params, record.metrics, tags, record.artifacts,
                         record.series, record.children, opened)
        log.warning("the MLflow store %s did not take the run %s: kept in %s until a later viasd command "
                    "(any stage, or tracking-init) reaches the store", tracking_uri(root), record.name, path)
    elif record.children:  # e.g. a search's Optuna trials, as nested runs
        record_children(root, experiment(params), run_id, record.children)
    return run_id


def open_stage_run(args) -> None:
    """Open the MLflow run of a study stage as it starts (`args.run_id`), named after the command and
    its grid cell until `track` gives it the stage's own name; None with --no-track or no parameters."""
    args.run_id = None
    if getattr(args, "no_track", True) or args.command in ("tracking-init", "resolve-params"):
        return
    from ..study.pending_runs import deliver_pending
    from ..study.tracking import PARENT_ENV, dvc_invocation, dvc_parent_run, open_run

    try:
        params = load_params(args)
    except ViasdError:
        return  # the stage itself reports the bad parameters
    deliver_pending(args.params.resolve().parent)  # runs an earlier stage could not record, if the store is back
    values = [getattr(args, k, None) for k in ("role", "pair", "task", "run")]
    if getattr(args, "worker", None) is not None:  # one of a search's workers
        values.append(f"worker{args.worker}")
    if getattr(args, "search", None) is not None:  # one search of a stage, run as a job of its own
        values.append(f"search-{args.search}")
    cell = ["+".join(v) if isinstance(v, list) else str(v) for v in values if v]  # --run is repeatable
    name = "/".join([args.command.replace("-", "_"), *cell])
    root = args.params.resolve().parent
    invocation = None if os.environ.get(PARENT_ENV) else dvc_invocation()
    if invocation:  # a DVC stage: nested under its invocation's parent run, as Snakemake's jobs are
        args.dvc_parent = dvc_parent_run(root, experiment(params), invocation)
        if args.dvc_parent:
            os.environ[PARENT_ENV] = args.dvc_parent
    args.run_id = open_run(root, experiment(params), name, {"stage": args.command.replace("-", "_")})


def close_stage_run(args, error: BaseException | None) -> None:
    """End the stage's run if `track` did not complete it: FAILED with the error, else FINISHED."""
    from ..study.tracking import close_run

    run_id = getattr(args, "run_id", None)
    if run_id:
        args.run_id = None
        close_run(args.params.resolve().parent, run_id, "FAILED" if error else "FINISHED",
                  f"{type(error).__name__}: {error}" if error else None)
    parent = getattr(args, "dvc_parent", None)
    if parent:  # the DVC invocation's parent ends with its latest stage (a later one sets it RUNNING again)
        args.dvc_parent = None
        close_run(args.params.resolve().parent, parent, "FAILED" if error else "FINISHED",
                  f"stage {os.environ.get('DVC_STAGE')}: {type(error).__name__}: {error}" if error else None)


def live_metric(args, key: str, every: int = 1):
    """A callback `(step, value)` logging `key` to the stage's open run every `every` steps (no-op
    without one)."""
    run_id = getattr(args, "run_id", None)
    if not run_id:
        return None
    from ..study.tracking import log_live

    root = args.params.resolve().parent

    def log(step: int, value: float) -> None:
        if step % every == 0:
            log_live(root, run_id, key, value, step)

    return log



def stage_parser(sub, name: str, help: str, func):
    """A subcommand of the study: reads params.yaml (+ --config overrides), records itself in MLflow."""
    p = sub.add_parser(name, help=help)
    add_params(p)
    p.set_defaults(func=func)
    return p



def load_params(args):
    """The command's parameters, parsed once per process (`open_stage_run` may have parsed them)."""
    from .. import config

    if getattr(args, "loaded_params", None) is None:
        args.loaded_params = config.load(args.params, args.config)
    return args.loaded_params



def record_params(args, rule: str, **wildcards: str) -> None:
    """Record the parameters this stage instance runs with (`study.stage_params`), before it writes anything:
    Snakemake then takes its outputs for current whoever ran it (DVC, or a person at a shell)."""
    from .. import config
    from ..study.stage_params import record_stage_params

    record_stage_params(config.resolve(args.params, args.config), rule, args.params.resolve().parent, **wildcards)
    args.stage_instances = [*getattr(args, "stage_instances", []), (rule, wildcards)]


def record_dvc_benchmarks(args, seconds: float) -> None:
    """Under `dvc repro` (DVC sets DVC_STAGE), write the Snakemake benchmark file of each stage instance this
    command ran (`study.stage_params.record_benchmark`), so Snakemake takes its outputs for current too."""
    if not os.environ.get("DVC_STAGE"):
        return
    from ..study.stage_params import record_benchmark

    for rule, wildcards in getattr(args, "stage_instances", []):
        record_benchmark(rule, seconds, args.params.resolve().parent, **wildcards)


def add_pair(p) -> None:
    p.add_argument("--pair", help="a pair of study.pairs (default: the first)")


def add_grid_cells(p) -> None:
    """--pair, --task, --run ...: runs of the study grid for one pair and task (see `grid_cells`)."""
    add_pair(p)
    p.add_argument("--task", required=True)
    p.add_argument("--run", action="append", metavar="RUN",
                   help="a method, or method-ablation, e.g. viasd-mask_random (repeatable; default: every run of "
                        "study.runs)")



def grid_cells(args, runs: list[str] | None = None):
    """Parameters, pair and run specs of a `--pair/--task/--run ...` command (`runs`, else --run, else
    `study.runs`)."""
    from ..study.runs import parse_run

    params = load_params(args)
    specs = []
    for text in runs or args.run or params.study.runs:
        try:
            specs.append(parse_run(text))
        except ValueError as err:
            raise ViasdError(f"--run {err}") from None
    if args.task not in params.tasks:
        raise ViasdError(f"--task {args.task!r} is not a task of params.yaml (tasks: {', '.join(params.tasks)})")
    return params, params.pair(args.pair), list(dict.fromkeys(specs))


def _setting(text: str) -> tuple[str, object]:
    """`KEY=VALUE` with a YAML value (a number, a list, null)."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError:
        raise argparse.ArgumentTypeError(f"{key.strip()}: {value!r} is not a value (a number, a list, null)") from None


def add_generation_args(p) -> None:
    """--generation-config/--no-generation-config and --generation KEY=VALUE (decoding/processors.py)."""
    p.add_argument("--generation-config", action=argparse.BooleanOptionalAction,
                   help="apply the per-token settings of the target's generation config (forced BOS/EOS, min length, "
                        "suppressed and banned tokens, no_repeat_ngram_size, repetition_penalty) as transformers' "
                        "generate does (default: on, or params.yaml's decode.generation_config; "
                        "--no-generation-config: raw logits)")
    p.add_argument("--generation", action="append", default=[], metavar="KEY=VALUE", type=_setting,
                   help="one of those settings over the generation config's (and params.yaml's decode.generation), "
                        "e.g. no_repeat_ngram_size=3, repetition_penalty=1.2, 'bad_words_ids=[[5], [7, 8]]'; may be "
                        "repeated")
