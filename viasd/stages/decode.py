"""`viasd decode --pair P --task T [--run R ...]`: the study grid's runs for one pair and task (default:
every run of `study.runs`) on the task's test split, with one load of the pair.

Each prompt is decoded once with greedy `ar` and once with every run, one after another in a balanced
order that changes from prompt to prompt (`run_order.interleaved`, the oracles included, their peeks timed apart),
so each run's `speedup_vs_ar` (its tokens per second over ar's)
is a ratio measured side by side in the same process and machine state, and agreement with the target's greedy output is exact.
Runs that would decode exactly alike (`decode_key`: the same policy and the same slim, or tiers off, where
no slim pass runs) are decoded once, under the first one's name; the others take its rows and statistics
and say so (`same_decode_as` in their summary): with a tuned policy that is SD for several ablations, or a
baseline mask that is the DIMR mask itself, a second decode would only measure the same passes again.
Outputs (named by pair, task and run):
  reports/decode/<pair>/<task>/<run>.jsonl   one row per example: tokens, text, statistics, ar tokens
  reports/decode/<pair>/<task>/<run>.json    summed statistics, speedup vs ar, the policy used
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..config import Params
from ..decoding.policy import DecodePolicy
from ..errors import StudyInputError
from ..study.cells import GridCell, input_files, load_pair_router
from ..study.paths import decode_paths, task_split
from ..study.record import StageRecord, cell_tags, scalars
from ..study.runs import RunSpec, parse_run
from ..study.slims import slim_description


def score_rows(models, prompts: list[list[int]], rows: list[dict], cache: dict, policy: DecodePolicy,
               groups: list[str]) -> dict:
    """Fidelity and the target's NLL of each row's output (one teacher-forced target pass per distinct
    output, written into the row; the target as `policy`'s generation settings process it, the same for
    every run), pooled over the rows by tokens, and the pooled fidelity's standard error clustered by the
    rows' `groups` (`TaskSpec.group`: cuts of one source file are alike). `cache` maps (prompt index, output
    tokens) to a score: the runs of one decode job that wrote the same tokens as another (every lossless run
    writes `ar`'s) are scored once."""
    from ..metrics.model_metrics import fidelity_standard_error, pooled

    scores = []
    for i, (prompt, row) in enumerate(zip(prompts, rows)):
        key = (i, tuple(row["token_ids"]))
        if key not in cache:
            cache[key] = models.score([prompt], [row["token_ids"]], policy)[1][0]
        scores.append(cache[key])
        row["fidelity"], row["target_nll"] = (cache[key]["fidelity"], cache[key]["nll"]) if cache[key] else (None, None)
    return {**pooled(scores), "fidelity_se": fidelity_standard_error(scores, groups)}


def decode_key(policy: DecodePolicy, slim) -> str:
    """What decides a run's tokens and passes: its policy and its slim (`slim_description`: the kept layers or
    `independent`), the slim left out when `viasd`'s tiers are all off (every block is then a plain `sd` block
    and no slim pass runs). Equal keys: the same decode."""
    return json.dumps([policy.as_record(), slim if policy.runs_slim else None], sort_keys=True, default=str)


def run_decode_stage(params: Params, pair_name: str, task: str, runs: Sequence[str] | None = None,
                     limit: int | None = None, progress: bool = True) -> list[dict]:
    """Decode the task split with `runs` (default: `study.runs`) side by side with `ar`, one load of the
    pair for all; writes each run's rows and summary, returns the summaries in the order of `runs`."""
    from ..evaluation.side_by_side import decode_side_by_side
    from ..study.slims import load_runs_models
    from ..tasks import get_task, load_examples

    specs = list(dict.fromkeys(parse_run(r) for r in (runs or params.study.runs)))
    pair = params.pair(pair_name)
    grid = {spec.name: GridCell.of(params, pair.name, task, spec) for spec in specs}
    split = params.decode.split
    task_spec = get_task(task)
    examples = load_examples(params.data.dir, task, split)[:limit]
    if not examples:
        raise StudyInputError(f"the {split} split of {task} has no examples")
    inputs = {name: cell.inputs for name, cell in grid.items()}
    policies = {name: cell.policy() for name, cell in grid.items()}
    reference = GridCell.of(params, pair.name, task, "ar").policy()
    models = load_runs_models(params, pair, {spec.name: (spec, inputs[spec.name].get("mask")) for spec in specs})
    for name, policy in policies.items():
        if policy.router == "learned":
            models[name].router = load_pair_router(params, pair.name, policy.drafter)
    ar_models = next(iter(models.values()))
    slims = {spec.name: slim_description(params, pair.name, spec) for spec in specs}
    first: dict[str, str] = {}  # decode key -> the first run with it
    same_as = {spec.name: first.setdefault(decode_key(policies[spec.name], slims[spec.name]), spec.name)
               for spec in specs if spec.method != "ar"}
    cells = {name: (models[name], policies[name]) for name, source in same_as.items() if source == name}
    rows, stats, ar_rows, ar_stats = decode_side_by_side(ar_models, reference, cells, examples, task_spec, progress)
    for name, source in same_as.items():  # a twin's rows are its source's (scoring writes the same values in)
        rows[name], stats[name] = rows[source], stats[source]
    prompts = [e.prompt_ids if e.prompt_ids is not None else ar_models.encode(e.prompt) for e in examples]
    groups = [task_spec.group(e) for e in examples]
    scored: dict = {}
    summaries = []
    for spec in specs:
        run_rows, run_stats = (rows[spec.name], stats[spec.name]) if spec.name in same_as else (ar_rows, ar_stats)
        target_scores = score_rows(ar_models, prompts, run_rows, scored, reference, groups)
        summaries.append(_write_run(params, pair.name, task, spec, split, run_rows, run_stats, ar_stats, target_scores,
                                    policies[spec.name], inputs[spec.name], slims[spec.name],
                                    same_as.get(spec.name, spec.name)))
    return summaries


def _write_run(params: Params, pair: str, task: str, spec: RunSpec, split: str, rows: list[dict], stats, ar_stats,
               target_scores: dict, policy: DecodePolicy, inputs: dict, slim, decoded_as: str) -> dict:
    """Write one run's rows and summary (`target_scores`: its pooled fidelity, the fidelity's standard error and
    the pooled NLL; `slim`: `slim_description`; `decoded_as`: the run whose decode it shares, its own name if
    none); returns the summary."""
    from ..io import write_json, write_jsonl

    summary = stats.as_dict()
    summary.update({
        "pair": pair, "task": task, "run": spec.name, "method": spec.method, "ablation": spec.ablation or "none",
        "split": split, "examples": len(rows), "ar_wall_time_s": ar_stats.wall_time_s,
        "ar_tokens_per_second": ar_stats.tokens_per_second,
        # per generated token: a lossy run may write more or fewer tokens than ar (a body that runs on, an
        # earlier stop), so the ratio of total times would charge it for its length, not its speed
        "speedup_vs_ar": (stats.tokens_per_second / ar_stats.tokens_per_second)
        if stats.tokens_per_second and ar_stats.tokens_per_second else None,
        "fidelity": target_scores["fidelity"], "fidelity_se": target_scores["fidelity_se"],
        "target_nll": target_scores["nll"],
        "policy": {k: v for k, v in policy.as_record().items() if k not in ("sampling", "eos_token_ids", "stop_strings")},
        "inputs": {k: str(v) for k, v in inputs.items()},
        "slim": slim,
        "same_decode_as": decoded_as if decoded_as != spec.name else None,
    })
    paths = decode_paths(params, pair, task, spec.name)
    write_jsonl(paths["rows"], rows)
    write_json(paths["summary"], summary)  # last: the summary marks a finished decode
    return summary


def decode_record(params: Params, pair_name: str, task: str, spec: RunSpec, summary: dict) -> StageRecord:
    """One grid cell's decode as an MLflow run: its policy, the summed statistics, the summary file."""
    pair = params.pair(pair_name)
    return StageRecord(
        "decode", f"decode/{pair.name}/{task}/{spec.name}",
        {"policy": summary["policy"], "split": summary["split"], "examples": summary["examples"], "slim": summary["slim"],
         "same_decode_as": summary.get("same_decode_as") or "none"},
        scalars(summary) | {f"passes.{k}": v for k, v in summary["passes"].items()}, cell_tags(pair, task, spec),
        [decode_paths(params, pair.name, task, spec.name)["summary"]], inputs=input_files(params, pair, task, spec.name),
        datasets=task_split(params, task, summary["split"]))
