# Validation and input functions shared by the rules. The parameters are validated by the same code
# the `viasd` commands use (workflow/schemas/params.schema.yaml plus cross-key checks), so a
# malformed params.yaml stops the workflow before any job runs, naming the key.
from pathlib import Path

from snakemake.exceptions import WorkflowError

from viasd import config as viasd_config
from viasd.stages.runs import parse_run

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

# every viasd command of the workflow reads the same parameters
VIASD_ARGS = " ".join(["--params params.yaml", *(f"--config {f}" for f in CONFIG_FILES)])
PARAMS = viasd_config.parse(config)
STUDY = config["study"]
DATA = config["data"]["dir"]
MODELS = config["models"]["dir"]
FAMILY = config["models"]["family"]
REPORTS = STUDY.get("reports", "reports")
MAIN_COST = config.get("dimr", {}).get("cost", "path")
BASELINES = config.get("dimr", {}).get("baselines", [])
RUNS = [parse_run(r) for r in STUDY["runs"]]
ALT_COSTS = sorted(
    {r.ablation[len("cost_"):] for r in RUNS if r.mask_kind and r.mask_kind.startswith("cost_")} - {MAIN_COST}
)


wildcard_constraints:
    pair="[A-Za-z0-9_]+",
    task="[a-z0-9_]+",
    run="[a-z_]+(-[a-z0-9_]+)?",
    role="target|draft|independent",
    cost="path|target",


def pair_models(pair, roles=("target", "draft")):
    """The trained family's model directories (built by train_model); hub pairs have none to build."""
    if pair != FAMILY:
        return []
    return [f"{MODELS}/{FAMILY}/{role}" for role in roles]


def run_models(wildcards):
    spec = parse_run(wildcards.run)
    roles = ["target"] if spec.method == "ar" else ["target", "draft"]
    if spec.ablation == "independent":
        roles.append("independent")
    return pair_models(wildcards.pair, roles)


def run_inputs(wildcards):
    """Mask and thresholds files a decode run reads (viasd.stages.decode_stage.run_inputs)."""
    from viasd.stages.decode_stage import run_inputs as inputs

    return {k: str(v) for k, v in inputs(PARAMS, wildcards.pair, wildcards.task, wildcards.run).items()}


def task_params(wildcards):
    return config["tasks"][wildcards.task]


def eval_files():
    return expand(
        f"{REPORTS}/eval/{{pair}}/{{task}}/{{run}}.json",
        pair=STUDY["pairs"],
        task=STUDY["tasks"],
        run=[r.name for r in RUNS],
    )
