"""`viasd batch-table --pair P --task T`: the study's speed against batch size, for the policies the study tuned.

The headline (`viasd decode`) is measured at batch 1, each prompt decoded by every run side by side, as the
method's source measures it. A serving engineer's first question is what is left of that gain when many requests
share the model: a full pass over B rows costs more than one over a single row once the pass stops being bound by
reading the weights, so SD's extra draft passes and rejected columns start to count, and a middle tier that saves
whole full-model passes may keep more of its gain, or less (its slim pass covers every row, its escalations a
sub-batch). This stage answers it for the study's own policies: transformers' batched greedy `generate` (left
padding), `ar`, `sd` at its best gamma on dev and the tuned `viasd`, on the first `batch_table.prompts` test
prompts, each decoded at most `size` at a time for each of `batch_table.sizes` (`bench.batch`: outputs checked
against `ar`'s batch-1 tokens, quality scored, then timed rounds).

Outputs (a folder per pair and task):
  reports/batch/<pair>/<task>/batch.json   per batch size: tokens/s and latency per method, target passes per
                                           token, the ratios sd/ar, viasd/sd, viasd/ar, ar/hf_ar with 95 %
                                           intervals (rounds as the units); every method's quality
  reports/batch/<pair>/<task>/batch.md     the same as a table
  reports/batch/<pair>/<task>/batch.png    throughput and the ratios against batch size
With `batch_table.sizes: []` the table is off: batch.json says so and nothing is decoded; so it does, with the
reason, for a pair that cannot decode in batches (encoder-decoder, sliding-window layers).
"""

from __future__ import annotations

import logging

from ..config import Params
from ..errors import PolicyError, StudyInputError
from ..io import write_json
from ..study.cells import input_files
from ..study.paths import batch_table_paths, mask_paths, task_split, threshold_paths
from ..study.record import StageRecord

log = logging.getLogger(__name__)


def run_batch_table_stage(params: Params, pair_name: str, task: str, progress: bool = True) -> dict:
    """Decode and time the batch table of `pair_name` on `task` (or, when `batch_table.sizes` is empty, write that
    it is off); returns the result `bench.batch.run_batch_benchmark` gives, with its files."""
    from ..bench.sweeps import run_batch_sweep

    settings = params.batch_table
    pair = params.pair(pair_name)
    paths = batch_table_paths(params, pair.name, task)
    if not settings.sizes:
        return _off(paths, pair.name, task, "batch_table.sizes is empty", unsupported=False)
    # the study's own policies or none: a missing search would silently bench defaults instead
    for path, command in ((mask_paths(params, pair.name)["mask"], f"viasd dimr-search --pair {pair.name}"),
                          (threshold_paths(params, task, pair.name, "main")["json"],
                           f"viasd tune-thresholds --pair {pair.name} --task {task}")):
        if not path.exists():
            raise StudyInputError(f"the batch table decodes the study's tuned policies, and {path} does not exist: "
                                  f"run `{command}` first")
    files = {k: paths[k] for k in ("json", "md", "png")}
    # `engine`: params.yaml's own (`decode`); the device and dtype the study's models run on
    try:
        return run_batch_sweep(params, pair.name, task, list(settings.sizes), settings.prompts,
                               settings.max_new_tokens, settings.repeats, None, params.device, "auto",
                               progress=progress, paths=files)
    except PolicyError as err:  # a pair that cannot decode in batches (encoder-decoder, sliding-window layers)
        if max(settings.sizes) == 1:
            raise
        log.warning("no batch table for %s on %s: %s", pair.name, task, err)
        for path in files.values():
            path.unlink(missing_ok=True)
        return _off(paths, pair.name, task, f"this pair does not decode in batches: {err}", unsupported=True)


def _off(paths: dict, pair: str, task: str, reason: str, unsupported: bool) -> dict:
    """Write the file that says the table was not made, and why (`unsupported`: the pair cannot batch, which the
    report says; else the table is switched off)."""
    off = {"pair": pair, "task": task, "off": True, "unsupported": unsupported, "batch_sizes": [], "rows": [],
           "reason": reason}
    write_json(paths["json"], off)
    return {**off, "files": {"json": paths["json"]}}


def batch_table_record(params: Params, pair_name: str, task: str, result: dict) -> StageRecord:
    """The batch table as an MLflow run: per batch size each method's tokens/s and latency, the ratios with their
    intervals and every method's quality (as `viasd bench --batch` records them), tagged with its pair and task."""
    from ..bench.sweeps import batch_record

    pair = params.pair(pair_name)
    if result.get("off"):
        return StageRecord("batch_table", f"batch_table/{pair.name}/{task}", {"batch_sizes": "off"}, {},
                           {"pair": pair.name, "task": task}, [result["files"]["json"]])
    bench = batch_record(result)
    return StageRecord("batch_table", f"batch_table/{pair.name}/{task}", bench.params, bench.metrics,
                       {"pair": pair.name, "task": task}, bench.artifacts, inputs=input_files(params, pair, task, "viasd"),
                       datasets=task_split(params, task, "test"))
