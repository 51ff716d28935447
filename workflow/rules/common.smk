# Validation and input functions shared by the rules. The parameters are validated by the same code
# the `viasd` commands use (viasd/schemas/params.schema.yaml, package data, plus cross-key checks), so a
# malformed params.yaml stops the workflow before any job runs, naming the key.
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

from viasd import config as viasd_config
from viasd.study.runs import parse_run
from viasd.study.slims import search_order, slims_to_tune
from viasd.study.stage_params import record_grid_params, record_stage_params

import os

CONFIG_FILES = [os.path.relpath(f) if not os.path.relpath(f).startswith("..") else str(f) for f in workflow.overwrite_configfiles]
try:
    _resolved = viasd_config.resolve("params.yaml", CONFIG_FILES)
    viasd_config.validate(config, " + ".join(["params.yaml", *CONFIG_FILES]))
except viasd_config.ConfigError as err:
    raise WorkflowError(f"viasd: error: {err}") from None
if _resolved != config:
    raise WorkflowError(
        "viasd: error: `--config KEY=VALUE` overrides do not reach the viasd commands; put them in a YAML "
        "file and pass it with --configfile"
    )

PARAMS = viasd_config.load("params.yaml", CONFIG_FILES)
# every viasd command of the workflow reads the same parameters
VIASD_ARGS = " ".join(["--params params.yaml", *(f"--config {f}" for f in CONFIG_FILES)])
STUDY = config["study"]
DATA = config["data"]["dir"]
MODELS = config["models"]["dir"]
FAMILY = config["models"]["family"]
REPORTS = STUDY.get("reports", "reports")
RUNS = [parse_run(r).name for r in STUDY["runs"]]
# every rule's parameter slice, written before the DAG is built (viasd/study/stage_params.py says why)
record_grid_params(config)


wildcard_constraints:
    pair="[A-Za-z0-9_]+",
    task="[a-z0-9_]+",
    run="[a-z_]+(-[a-z0-9_]+)?",
    role="target|draft|independent",
    split="dev|test",
    drafter="feature",
    k="[0-9]+",
    search="[a-z0-9_]+",


def pair_models(pair, roles=("target", "draft")):
    """The trained family's model directories (built by train_model); hub pairs have none to build."""
    if pair != FAMILY:
        return []
    return [f"{MODELS}/{FAMILY}/{role}" for role in roles]


def feature_drafter(pair, methods=None):
    """The family's feature drafter (built by train_drafter) where a run of the grid drafts with it (a
    drafter_feature ablation; `methods`: of these methods only); hub pairs have none."""
    specs = [parse_run(r) for r in STUDY["runs"]]
    if pair != FAMILY or not any(s.drafter == "feature" and (methods is None or s.method in methods) for s in specs):
        return []
    return [f"{MODELS}/{FAMILY}/feature_drafter"]


def params_file(rule):
    """The rule's slice of the parameters as an input file, rewritten only when a value in it changes
    (viasd/study/stage_params.py says why: Snakemake and DVC then agree on what is up to date)."""

    def path(wildcards):
        return str(record_stage_params(config, rule, ".", **dict(wildcards.items())))

    return path


# a model job asks a cluster for a GPU only where the study runs its models on one (models.device cuda or
# cuda:N); cpu and auto ask for none (auto still uses a GPU the node has)
GPU = 1 if str(config["models"].get("device", "auto")).startswith("cuda") else 0

# what each stage reads of data/: training and the mask search never read task prompts
CORPUS = [f"{DATA}/tokenizer", f"{DATA}/corpus", f"{DATA}/manifest.json"]
DECODE_SPLIT = config["decode"]["split"]


def search_workers(section, name):
    """The marker files of a search's workers (`dimr.workers` / `thresholds.workers` > 1): the search's own
    rule waits for them, then picks the result from the shared Optuna storage (and runs any trial a lost
    worker left). None with one worker: the search's rule runs every trial itself."""
    n = config.get(section, {}).get("workers", 1)
    return [] if n == 1 else [f"{MODELS}/workers/{section}/{name}/worker-{k}.json" for k in range(1, n + 1)]


def search_parts(pair, task, first=None):
    """The marker files of a pair and task's threshold searches run as jobs of their own
    (`thresholds.split_searches`, with one worker): the first search's (`first=True`), or every other's
    (`first=False`), which start from it; None: all. The search's own rule waits for them all, then finds
    every study complete and confirms and picks."""
    if not PARAMS.thresholds.split_searches or PARAMS.thresholds.workers > 1:
        return []
    order = search_order(slims_to_tune(PARAMS))
    names = order if first is None else order[:1] if first else order[1:]
    return [f"{MODELS}/workers/thresholds/{pair}-{task}/search-{name}.json" for name in names]


def eval_files():
    return expand(
        f"{REPORTS}/eval/{{pair}}/{{task}}/{{run}}.json",
        pair=STUDY["pairs"],
        task=STUDY["tasks"],
        run=RUNS,
    )


# the MLflow parent run of this invocation (Snakefile's onstart/onsuccess/onerror): its id is exported
# in this environment variable, which every job inherits (viasd nests its stage run under it)
PARENT_RUN = "VIASD_PARENT_RUN_ID"


def end_parent(status):
    run_id = os.environ.get(PARENT_RUN)
    if run_id:
        shell(f"viasd tracking-init {VIASD_ARGS} --end-parent {run_id} --status {status}")


def record_in_dvc():
    """After a successful run of the whole study, record its outputs in dvc.lock (`dvc commit -f`), so that `dvc
    status` finds them current and `dvc repro` re-runs only what a later change touches. Only when this run's
    parameters are params.yaml's (DVC reads nothing else: with --configfile, `viasd resolve-params` writes the merged
    file first) and it reached `all` (a partial target leaves other stages' outputs behind their parameters)."""
    import shutil

    targets = set(workflow.dag_settings.targets or ())
    if targets - {"all"} or not Path(".dvc").is_dir() or shutil.which("dvc") is None:
        return
    if _resolved != viasd_config.resolve("params.yaml"):
        logger.info("viasd: dvc.lock not updated: this run's parameters merge --configfile files that DVC does "
                    "not read (`viasd resolve-params --config FILE -o params.yaml` makes them params.yaml's)")
        return
    shell("dvc commit --force --quiet")
    logger.info("viasd: dvc.lock records this run's outputs (dvc status: up to date)")
