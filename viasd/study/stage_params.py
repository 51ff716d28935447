"""What each stage of the study reads of the parameters, recorded in a small file per stage instance, so that
Snakemake and DVC agree on what is up to date.

DVC decides from `dvc.lock` (the values of each stage's `params:` keys when it last ran); Snakemake from its own
metadata, which only Snakemake writes. Had the rules kept parameter values as Snakemake `params:`, a stage that `dvc
repro` re-ran after an edit would still look stale to Snakemake (its metadata remembers the old values). Instead each
rule takes its slice of the parameters as an input, `.viasd/params/<rule>/<instance>/params.json`, written only when
its content changes, both by the Snakefile when it builds the DAG and by the stage's `viasd` command when it starts
(whoever runs it: Snakemake, DVC or a person). A changed value gives its folder a new time, so Snakemake re-runs the
rule; a stage DVC re-ran wrote the file before its outputs, and its Snakemake benchmark file after them
(`record_benchmark`: Snakemake compares inputs with the older of a job's outputs and benchmark), so Snakemake finds
them newer and runs nothing.

A dry run (`snakemake -n`) records the values it was given too: after a dry run of an edit that is then undone, the
rules it would have re-run look stale to Snakemake once (their folders are newer than their outputs).

The slices are what each stage reads. A task's prompts leave out the other split's prompt count (a change to the
test prompts re-runs no threshold search); DVC's `prepare_task` lists the whole task and may re-run the other split,
whose prompts file then comes out the same (Snakemake compares small input files by checksum, so nothing downstream
follows).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

from ..config import DecodeParams
from ..io import write_text

ROOT = Path(".viasd") / "params"  # beside params.yaml


def _family(cfg: dict) -> dict:
    return cfg["models"]["families"][cfg["models"]["family"]]


def _self_drafter(cfg: dict) -> dict:
    """`models.self_drafter` where a run of the grid drafts with it (`drafter_self`), else nothing (the slices of
    grids without one stay as they were)."""
    if not any(run.endswith("-drafter_self") for run in cfg["study"]["runs"]):
        return {}
    return {"self_drafter": cfg["models"].get("self_drafter")}


def _own_searches(cfg: dict) -> list[str]:
    """The ablations of the grid's runs that need a DIMR search of their own (`cost_<fn>`, `prefix_<n>`): the
    only part of `study.runs` the DIMR search reads, so adding any other run (a drafter, a baseline) re-runs no
    search and nothing after it."""
    from .runs import parse_run

    return sorted({spec.ablation for spec in map(parse_run, cfg["study"]["runs"]) if spec.own_search})


def _task_split(cfg: dict, task: str, split: str) -> dict:
    other = "test" if split == "dev" else "dev"
    return {k: v for k, v in cfg["tasks"][task].items() if k != f"{other}_prompts"}


# the keys of `decode` the batch table reads: sd's gamma setting and the engine options (dvc.yaml's batch_table
# stage lists the same; tests/test_stage_params.py checks it)
BATCH_TABLE_DECODE = ("sd_gamma", *DecodeParams().engine())

# rule -> (its wildcards in file-name order, its slice of the merged parameters)
SLICES: dict[str, tuple[tuple[str, ...], Callable[..., dict]]] = {
    "prepare_corpus": ((), lambda cfg: {"seed": cfg["seed"], "data": cfg["data"]}),
    "prepare_task": (("task", "split"), lambda cfg, task, split: {"seed": cfg["seed"],
                                                                   "task": _task_split(cfg, task, split)}),
    "train_model": (("role",), lambda cfg, role: {"seed": cfg["seed"], "family": _family(cfg), "train": cfg["train"]}),
    "train_drafter": (("drafter",), lambda cfg, drafter: {"seed": cfg["seed"], "train": cfg["train"],
                                                          "drafter": _family(cfg).get(f"{drafter}_drafter")}),
    "dimr_search": (("pair",), lambda cfg, pair: {"seed": cfg["seed"], "dimr": cfg["dimr"],
                                                  "searches": _own_searches(cfg)}),
    # a worker searches the mask; the baseline masks are the search rule's alone
    "dimr_worker": (("pair",), lambda cfg, pair: {"seed": cfg["seed"], "searches": _own_searches(cfg),
                                                  "dimr": {k: v for k, v in cfg["dimr"].items() if k != "baselines"}}),
    # the drafters it fits a router for: the draft model's, and each that a viasd-drafter_<name> run drafts with
    "train_router": (("pair",), lambda cfg, pair: {
        "seed": cfg["seed"], "router": cfg.get("router", {}), "gamma": cfg["thresholds"]["gamma"],
        **({"drafters": drafters} if (drafters := [r for r in cfg["study"]["runs"] if r.startswith("viasd-drafter_")])
           else {}), **_self_drafter(cfg)}),
    # the dev prompts come from dev.jsonl: the task's prompt counts are not parameters of the search
    "tune_thresholds": (("pair", "task"), lambda cfg, pair, task: {
        "seed": cfg["seed"], "thresholds": cfg["thresholds"], "runs": cfg["study"]["runs"],
        "max_new_tokens": cfg["tasks"][task].get("max_new_tokens"), **_self_drafter(cfg)}),
    "decode": (("pair", "task"), lambda cfg, pair, task: {"seed": cfg["seed"], "decode": cfg["decode"],
                                                          "task": cfg["tasks"][task], "runs": cfg["study"]["runs"],
                                                          **_self_drafter(cfg)}),
    # the batch table reads of `decode` sd's gamma setting and the engine options (the tuned policies' own fields
    # come from the thresholds files), its own settings, the task's length
    "batch_table": (("pair", "task"), lambda cfg, pair, task: {
        "seed": cfg["seed"], "batch_table": cfg.get("batch_table", {}),
        "decode": {k: v for k, v in cfg["decode"].items() if k in BATCH_TABLE_DECODE},
        "max_new_tokens": cfg["tasks"][task].get("max_new_tokens")}),
    "evaluate": (("pair", "task"), lambda cfg, pair, task: {"task": cfg["tasks"][task], "runs": cfg["study"]["runs"]}),
    "report": ((), lambda cfg: {"study": cfg["study"], "thresholds": cfg["thresholds"]}),
}


def record_grid_params(cfg: dict, base: str | Path = ".") -> list[Path]:
    """Record the slice of every instance of every rule the grid of `cfg` can run (its pairs, tasks, both splits,
    the family's roles, `study.drafters`), before Snakemake builds its DAG. The input functions record them too,
    but while the DAG is built Snakemake 9 may judge a folder by a listing of its parent it cached before the
    folder was written (seen with explicit targets on a fresh clone: `MissingInputException` for
    `.viasd/params/train_model/independent`); written first, every folder is in that listing."""
    study = cfg["study"]
    values = {"pair": study["pairs"], "task": study["tasks"], "split": ["dev", "test"],
              "role": ["target", "draft", "independent"], "drafter": study.get("drafters") or []}
    folders = []
    for rule, (names, _) in SLICES.items():
        for combo in itertools.product(*(values[n] for n in names)):
            folders.append(record_stage_params(cfg, rule, base, **dict(zip(names, combo))))
    return folders


# each rule's Snakemake `benchmark:` file (workflow/rules/*.smk), by its wildcards
BENCHMARKS = {
    "prepare_corpus": "benchmarks/prepare_corpus.tsv",
    "prepare_task": "benchmarks/prepare_task/{task}-{split}.tsv",
    "train_model": "benchmarks/train_model/{role}.tsv",
    "train_drafter": "benchmarks/train_drafter/{drafter}.tsv",
    "dimr_search": "benchmarks/dimr_search/{pair}.tsv",
    "train_router": "benchmarks/train_router/{pair}.tsv",
    "tune_thresholds": "benchmarks/tune_thresholds/{pair}-{task}.tsv",
    "decode": "benchmarks/decode/{pair}/{task}.tsv",
    "evaluate": "benchmarks/evaluate/{pair}/{task}.tsv",
    "batch_table": "benchmarks/batch_table/{pair}/{task}.tsv",
    "report": "benchmarks/report.tsv",
}
BENCHMARK_COLUMNS = ("s", "h:m:s", "max_rss", "max_vms", "max_uss", "max_pss", "io_in", "io_out", "mean_load",
                     "cpu_time")


def record_benchmark(rule: str, seconds: float, base: str | Path = ".", **wildcards: str) -> Path | None:
    """Write `rule`'s Snakemake benchmark file (Snakemake's columns; the peak RSS in MB, what this process cannot
    measure `NA`) for a stage DVC ran. Snakemake counts a job's benchmark file among its outputs when it compares
    times, so a stage DVC re-ran must refresh it too; the report's stage times then include DVC's runs."""
    import resource

    template = BENCHMARKS.get(rule)
    if template is None:
        return None
    path = Path(base) / template.format(**wildcards)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes
    clock = f"{int(seconds // 3600)}:{int(seconds % 3600 // 60):02d}:{int(seconds % 60):02d}"
    row = [f"{seconds:.4f}", clock, f"{rss_mb:.2f}", *["NA"] * (len(BENCHMARK_COLUMNS) - 3)]
    write_text(path, "\t".join(BENCHMARK_COLUMNS) + "\n" + "\t".join(row) + "\n")
    return path


def stage_params_path(rule: str, base: str | Path = ".", **wildcards: str) -> Path:
    """`.viasd/params/<rule>/<instance>/` under `base` (the directory of params.yaml), which holds the slice as
    `params.json`; the instance is the rule's wildcard values joined by `-` in `SLICES` order (`all` for a rule
    without wildcards). A folder, not the file, is the rule's input: Snakemake compares a small input file's
    checksum with the one it recorded when it last ran the rule, so a slice edited back to those values after DVC
    ran the rule with others would look unchanged; a folder it judges by its time alone."""
    names, _ = SLICES[rule]
    instance = "-".join(str(wildcards[n]) for n in names) or "all"
    return Path(base) / ROOT / rule / instance


def stage_params(cfg: dict, rule: str, **wildcards: str) -> dict:
    """The parameters `rule`'s instance reads, from the merged parameter dict `cfg`."""
    names, slice_ = SLICES[rule]
    return slice_(cfg, **{n: wildcards[n] for n in names})


def record_stage_params(cfg: dict, rule: str, base: str | Path = ".", **wildcards: str) -> Path:
    """Write `rule`'s parameter slice to its folder unless it already holds it (the folder's time then stays, so
    nothing that ran with these values looks stale); atomic. Returns the folder."""
    folder = stage_params_path(rule, base, **wildcards)
    text = json.dumps(stage_params(cfg, rule, **wildcards), sort_keys=True, indent=1, default=str) + "\n"
    try:
        if (folder / "params.json").read_text() == text:
            return folder
    except OSError:
        pass
    write_text(folder / "params.json", text)  # a new entry in the folder: the folder's time moves
    return folder
