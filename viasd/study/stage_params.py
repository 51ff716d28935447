"""What each stage of the study reads of the parameters, recorded in a small file per stage instance, so that
Snakemake and DVC agree on what is up to date.

DVC decides from `dvc.lock` (the values of each stage's `params:` keys when it last ran); Snakemake from its own
metadata, which only Snakemake writes. Had the rules kept parameter values as Snakemake `params:`, a stage that `dvc
repro` re-ran after an edit would still look stale to Snakemake (its metadata remembers the old values). Instead each
rule takes its slice of the parameters as an input file, `.viasd/params/<rule>/<instance>.json`, written only when
its content changes, both by the Snakefile when it builds the DAG and by the stage's `viasd` command when it starts
(whoever runs it: Snakemake, DVC or a person). A changed value gives the file a new time, so Snakemake re-runs the
rule; a stage DVC re-ran wrote the file before its outputs, so Snakemake finds them newer and runs nothing.

The slices are what each stage reads. A task's prompts leave out the other split's prompt count (a change to the
test prompts re-runs no threshold search); DVC's `prepare_task` lists the whole task and may re-run the other split,
whose file then comes out the same (Snakemake compares small inputs by checksum, so nothing downstream follows).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ..io import write_text

ROOT = Path(".viasd") / "params"  # beside params.yaml


def _family(cfg: dict) -> dict:
    return cfg["models"]["families"][cfg["models"]["family"]]


def _task_split(cfg: dict, task: str, split: str) -> dict:
    other = "test" if split == "dev" else "dev"
    return {k: v for k, v in cfg["tasks"][task].items() if k != f"{other}_prompts"}


# rule -> (its wildcards in file-name order, its slice of the merged parameters)
SLICES: dict[str, tuple[tuple[str, ...], Callable[..., dict]]] = {
    "prepare_corpus": ((), lambda cfg: {"seed": cfg["seed"], "data": cfg["data"]}),
    "prepare_task": (("task", "split"), lambda cfg, task, split: {"seed": cfg["seed"],
                                                                   "task": _task_split(cfg, task, split)}),
    "train_model": (("role",), lambda cfg, role: {"seed": cfg["seed"], "family": _family(cfg), "train": cfg["train"]}),
    "train_drafter": (("drafter",), lambda cfg, drafter: {"seed": cfg["seed"], "train": cfg["train"],
                                                          "drafter": _family(cfg).get(f"{drafter}_drafter")}),
    "dimr_search": (("pair",), lambda cfg, pair: {"seed": cfg["seed"], "dimr": cfg["dimr"],
                                                  "runs": cfg["study"]["runs"]}),
    # a worker searches the mask; the baseline masks are the search rule's alone
    "dimr_worker": (("pair",), lambda cfg, pair: {"seed": cfg["seed"], "runs": cfg["study"]["runs"],
                                                  "dimr": {k: v for k, v in cfg["dimr"].items() if k != "baselines"}}),
    "train_router": (("pair",), lambda cfg, pair: {"seed": cfg["seed"], "router": cfg.get("router", {}),
                                                   "gamma": cfg["thresholds"]["gamma"]}),
    # the dev prompts come from dev.jsonl: the task's prompt counts are not parameters of the search
    "tune_thresholds": (("pair", "task"), lambda cfg, pair, task: {
        "seed": cfg["seed"], "thresholds": cfg["thresholds"], "runs": cfg["study"]["runs"],
        "max_new_tokens": cfg["tasks"][task].get("max_new_tokens")}),
    "decode": (("pair", "task"), lambda cfg, pair, task: {"seed": cfg["seed"], "decode": cfg["decode"],
                                                          "task": cfg["tasks"][task], "runs": cfg["study"]["runs"]}),
    "evaluate": (("pair", "task"), lambda cfg, pair, task: {"task": cfg["tasks"][task], "runs": cfg["study"]["runs"]}),
    "report": ((), lambda cfg: {"study": cfg["study"], "thresholds": cfg["thresholds"]}),
}


def stage_params_path(rule: str, base: str | Path = ".", **wildcards: str) -> Path:
    """`.viasd/params/<rule>/<instance>.json` under `base` (the directory of params.yaml); the instance is the
    rule's wildcard values joined by `-` in `SLICES` order (`all` for a rule without wildcards)."""
    names, _ = SLICES[rule]
    instance = "-".join(str(wildcards[n]) for n in names) or "all"
    return Path(base) / ROOT / rule / f"{instance}.json"


def stage_params(cfg: dict, rule: str, **wildcards: str) -> dict:
    """The parameters `rule`'s instance reads, from the merged parameter dict `cfg`."""
    names, slice_ = SLICES[rule]
    return slice_(cfg, **{n: wildcards[n] for n in names})


def record_stage_params(cfg: dict, rule: str, base: str | Path = ".", **wildcards: str) -> Path:
    """Write `rule`'s parameter slice to its file unless the file already holds it (its time then stays, so
    nothing that ran with these values looks stale); atomic. Returns the path."""
    path = stage_params_path(rule, base, **wildcards)
    text = json.dumps(stage_params(cfg, rule, **wildcards), sort_keys=True, indent=1, default=str) + "\n"
    try:
        if path.read_text() == text:
            return path
    except OSError:
        pass
    write_text(path, text)
    return path
