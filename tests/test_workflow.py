"""The study workflow with the real tools on a copy of the repository: the two DAGs side by side, and the study
through Snakemake and MLflow (the DVC path: tests/test_dvc_pipeline.py).

The smoke configuration (config/smoke.yaml) keeps every run to a few minutes on 2 CPU cores.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from workflow_helpers import (
    BIN,
    GOLDEN,
    SMOKE_RUNS,
    covers,
    dvc_stages,
    expected_run_names,
    md_rows,
    planned_rules,
    run,
    smoke_fingerprint,
    snakemake,
    snakemake_jobs,
    tool_env,
)

from viasd.study.stage_params import BENCHMARKS

SMOKE = ["--configfile", "config/smoke.yaml"]



# ---------------------------------------------------------------- DAG definitions ------------------


@pytest.mark.parametrize("config", ["default", "smoke"])
def test_snakemake_and_dvc_dags_do_not_drift(repo, config):
    """Same stage set and commands; every Snakemake output is a DVC out (or lies in one) and vice versa;
    each stage depends on the same upstream stages and inputs in both."""
    if config == "smoke":  # DVC reads params.yaml: write the merged parameters there
        run([str(BIN / "viasd"), "resolve-params", "--config", "config/smoke.yaml", "-o", "params.yaml"], repo)
    jobs, stages = snakemake_jobs(repo), dvc_stages(repo)
    # a search's workers and parts (thresholds.split_searches, which the smoke config sets) only spread its
    # trials over Snakemake jobs; their markers are no stage's output, and DVC runs each stage's command whole
    spread = {"thresholds_search", "thresholds_worker", "dimr_worker"}
    assert {job["rule"] for job in jobs.values()} & spread == ({"thresholds_search"} if config == "smoke" else set())
    markers = {out for job in jobs.values() if job["rule"] in spread for out in job["outputs"]}
    jobs = {cmd: {**job, "inputs": job["inputs"] - markers} for cmd, job in jobs.items() if job["rule"] not in spread}
    # each rule's one parameter file (viasd/study/stage_params.py): Snakemake's view of the parameters DVC reads from
    # params.yaml itself
    for cmd, job in jobs.items():
        recorded = {p for p in job["inputs"] if p.startswith(".viasd/params/")}
        assert len(recorded) == 1 and next(iter(recorded)).startswith(f".viasd/params/{job['rule']}/"), (cmd, recorded)
        job["inputs"] -= recorded
        # the benchmark file a stage run by DVC writes for Snakemake is the rule's own
        assert job.get("benchmark") == BENCHMARKS[job["rule"]].format(**job.get("wildcards", {})), cmd
    assert set(jobs) == set(stages), (set(jobs) ^ set(stages))
    assert len(jobs) >= 7

    def producers(paths, table: dict, key: str) -> set[str]:
        """The stages whose outputs overlap any of `paths` (a directory dependency takes all inside it)."""
        return {cmd for cmd, item in table.items() for out in item[key] for p in paths
                if covers(out, p) or covers(p, out)}

    for cmd, job in jobs.items():
        stage = stages[cmd]
        for out in job["outputs"]:
            assert any(covers(o, out) for o in stage["outs"]), f"{cmd}: Snakemake output {out} is not a DVC out"
        for out in stage["outs"]:
            assert any(covers(out, o) for o in job["outputs"]), f"{cmd}: DVC out {out} is no Snakemake output"
        data_deps = {d for d in stage["deps"] if not d.startswith("viasd/")}
        for path in job["inputs"]:
            assert any(covers(d, path) or covers(path, d) for d in data_deps), f"{cmd}: input {path} not in dvc.yaml"
        for dep in data_deps:
            assert any(covers(dep, p) or covers(p, dep) for p in job["inputs"]), f"{cmd}: DVC dep {dep} not in Snakefile"
        assert producers(job["inputs"], jobs, "outputs") == producers(data_deps, stages, "outs"), cmd


def test_snakemake_lint_is_clean(repo):
    for extra in ([], SMOKE):
        out = snakemake(repo, "--lint", *extra)
        assert "Congratulations, your workflow is in a good condition" in out.stdout + out.stderr


@pytest.mark.parametrize("change, key", [
    ({"train": {"batch_size": "four"}}, "train.batch_size: 'four' is not of type 'integer'"),
    ({"study": {"runs": ["ar", "beam"]}}, "study.runs.1: 'beam': unknown method 'beam'"),
    ({"models": {"hub_pairs": {"mine": {"target": "./no/such/model", "draft": "./no/draft"}}},
      "study": {"pairs": ["mine"]}}, "models.hub_pairs.mine.target: no model directory at ./no/such/model"),
])
def test_malformed_params_stop_before_any_job(repo, change, key):
    from viasd.config import deep_merge

    raw = deep_merge(yaml.safe_load((repo / "params.yaml").read_text()), change)
    (repo / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    out = snakemake(repo, "--cores", "1", "all", check=False)
    assert out.returncode != 0
    assert key in out.stdout + out.stderr
    assert not any((repo / d).exists() for d in ("data", "logs", "models", "reports"))


# ---------------------------------------------------------------- Snakemake end to end ------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rest(port: int, path: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"}, method="POST" if data else "GET")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _check_outputs_whole(repo: Path) -> int:
    """Every output file present is complete: JSON parses, a decode summary's rows are all there."""
    checked = 0
    for path in (repo / "reports-smoke").rglob("*.json"):
        data = json.loads(path.read_text())
        if path.parent.parent.parent.name == "decode":
            rows = path.with_suffix(".jsonl").read_text().splitlines()
            assert len(rows) == data["examples"]
        checked += 1
    for path in (repo / "models-smoke").rglob("*.json"):
        json.loads(path.read_text())
        checked += 1
    return checked


@pytest.mark.slow
def test_smoke_study_killed_resumed_tracked_and_reported(repo):
    """One parallel smoke run killed mid-decode, then completed; no half-written output, each stage run
    exactly once in MLflow (also through `mlflow ui`'s REST API), the report built, a re-run is a no-op."""
    env = tool_env()
    proc = subprocess.Popen([str(BIN / "snakemake"), "--cores", "4", "all", *SMOKE], cwd=repo, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 600
    while proc.poll() is None and time.time() < deadline:
        if (repo / "logs" / "decode").exists() and any((repo / "logs" / "decode").rglob("*.log")):
            time.sleep(1.0)
            break
        time.sleep(0.3)
    assert proc.poll() is None, "the workflow ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (repo / "reports-smoke" / "summary.md").exists()
    _check_outputs_whole(repo)

    snakemake(repo, "--unlock", *SMOKE)
    snakemake(repo, "--cores", "4", "all", *SMOKE)
    assert _check_outputs_whole(repo) >= 2 * len(SMOKE_RUNS)
    table = md_rows((repo / "reports-smoke" / "tables" / "smoke-stdlib_continuation.md").read_text())
    assert {row[0] for row in table} >= set(SMOKE_RUNS)
    for plot in ("smoke-stdlib_continuation-frontier.png", "smoke-stdlib_continuation-tiers.png"):
        assert (repo / "reports-smoke" / "plots" / plot).stat().st_size > 1000
    assert (repo / "reports-smoke" / "dimr" / "smoke" / "search.png").exists()
    csv_rows = (repo / "reports-smoke" / "tables" / "smoke-stdlib_continuation.csv").read_text().splitlines()
    assert len(csv_rows) == 1 + len(SMOKE_RUNS) and "vs_sd_best.ratio" in csv_rows[0] and "vs_ar.low" in csv_rows[0]
    slims = md_rows((repo / "reports-smoke" / "tables" / "smoke-stdlib_continuation-slims.md").read_text())
    assert {row[0] for row in slims} >= {"main", "mask_random", "independent"}
    # the cost model the DIMR slim's search stored, every layout with its fitted costs in ms
    costs = {row[0]: row for row in md_rows((repo / "reports-smoke" / "tables" /
                                             "smoke-stdlib_continuation-pass-costs.md").read_text())[1:]}
    stored = json.loads((repo / "models-smoke" / "thresholds" / "smoke-stdlib_continuation" / "main.json")
                        .read_text())["pass_cost_model"]
    assert set(costs) == set(stored) >= {"draft:1", "target:4"}
    for layout, c in stored.items():
        assert float(costs[layout][1]) == pytest.approx(1000 * c["per_pass"], abs=1e-3)
        assert float(costs[layout][2]) == pytest.approx(1000 * c["per_token"], abs=1e-3)
    assert (repo / "reports-smoke" / "thresholds" / "smoke-stdlib_continuation" / "mask_random.png").exists()
    # the family table: every model and slim with its measured agreement with the target; the stage times
    family = (repo / "reports-smoke" / "tables" / "smoke-family.csv").read_text().splitlines()
    rows = {line.split(",")[0]: line.split(",") for line in family[1:]}
    assert set(rows) == {"target", "draft", "independent", "slim (DIMR)", "slim (random)", "slim (truncate)",
                         "slim (every_other)"}
    header = family[0].split(",")
    assert float(rows["target"][header.index("agreement")]) == 1.0
    assert 0 < float(rows["draft"][header.index("agreement")]) < 1
    assert float(rows["target"][header.index("train_seconds")]) > 0
    # the machine's speed gauge: each trained model's steps per second, and the precision it trained in
    assert float(rows["target"][header.index("steps_per_second")]) > 0 and rows["draft"][header.index("precision")] == "float32"
    times = {row[0]: row for row in md_rows((repo / "reports-smoke" / "tables" / "stage-times.md").read_text())}
    assert times["train_model"][1] == "3" and "decode" in times

    again = snakemake(repo, "--cores", "2", "all", *SMOKE)
    assert "Nothing to be done" in again.stdout + again.stderr
    # a task's prompt count re-runs that task's prompts, decodes, batch table, evaluations and the report: no training,
    # no mask search, no threshold search (it reads the dev prompts, untouched)
    # (edited in the smoke file itself: another --configfile would change every job's command line)
    original = (repo / "config" / "smoke.yaml").read_text()
    smoke = yaml.safe_load(original)
    smoke["tasks"]["stdlib_continuation"]["test_prompts"] -= 1
    (repo / "config" / "smoke.yaml").write_text(yaml.safe_dump(smoke, sort_keys=False))
    planned = snakemake(repo, "-n", "all", *SMOKE)
    (repo / "config" / "smoke.yaml").write_text(original)
    rules = planned_rules(planned.stdout + planned.stderr)
    assert rules == {"prepare_task", "decode", "batch_table", "evaluate", "report", "all"}, rules

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("viasd-smoke")
    finished = [r for r in client.search_runs([exp.experiment_id], max_results=1000) if r.info.status == "FINISHED"]
    runs = [r for r in finished if r.data.tags.get("stage") not in ("study", "trial")]
    assert sorted(r.info.run_name for r in runs) == expected_run_names()
    # one parent run per invocation that ran jobs; the completing invocation's stage runs are nested under it
    parents = [r for r in finished if r.data.tags.get("stage") == "study"]
    assert len(parents) == 1 and parents[0].info.run_name == "study/smoke"
    nested = {r.data.tags.get("mlflow.parentRunId") for r in runs if r.info.run_name.startswith(("decode", "report"))}
    assert nested == {parents[0].info.run_id}
    assert {"mlflow.source.git.commit", "git_dirty"} <= set(runs[0].data.tags)
    by_name = {r.info.run_name: r for r in runs}
    viasd = by_name["evaluate/smoke/stdlib_continuation/viasd"].data
    assert viasd.tags["method"] == "viasd" and viasd.tags["ablation"] == "none" and viasd.tags["stage"] == "evaluate"
    assert {"rejection_rate", "acceptance_rate", "mean_accepted_length", "speedup_vs_ar", "speed.vs_ar.ratio",
            "quality.agreement",
            "accepted_by_tier.accepted_direct", "passes.target"} <= set(viasd.metrics)
    # the report's saved view of the MLflow runs table: its filter finds the evaluate run of every run of the grid,
    # each with its speed over SD at its best gamma
    from viasd.study import mlflow_view

    view = json.loads(exp.tags[mlflow_view.VIEW_TAG_PREFIX + mlflow_view.VIEW_ID])
    compared = client.search_runs([exp.experiment_id], json.loads(view["state"])["searchFilter"], max_results=1000)
    assert sorted(r.info.run_name for r in compared) == [n for n in expected_run_names() if n.startswith("evaluate/")]
    assert all("speed.vs_sd_best.ratio" in r.data.metrics for r in compared)
    assert "compare the runs" in exp.tags["mlflow.note.content"]
    decode = by_name["decode/smoke/stdlib_continuation/viasd-mask_random"].data
    assert decode.tags["ablation"] == "mask_random" and len(decode.tags["git_commit"]) == 40
    assert decode.tags["dvc_md5.model.target"].endswith(".dir") and "dvc_md5.thresholds" in decode.tags
    # what a behaviour-keeping change must not move: masks, searched policies, timing-free tokens, MLflow
    # run names, against the fingerprint recorded before the study layer's refactor (tests/golden/)
    fingerprint = smoke_fingerprint(repo)
    golden = json.loads(GOLDEN.read_text())
    for key in golden:
        assert fingerprint[key] == golden[key], f"the smoke study's {key} changed (tests/golden/README.md)"

    port = _free_port()
    ui = subprocess.Popen([str(BIN / "mlflow"), "ui", "--backend-store-uri", f"sqlite:///{repo / 'mlflow.db'}",
                           "--host", "127.0.0.1", "--port", str(port)], cwd=repo, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 90
        while True:
            try:
                exp_id = _rest(port, "/api/2.0/mlflow/experiments/get-by-name?experiment_name=viasd-smoke")
                break
            except OSError:
                assert time.time() < deadline and ui.poll() is None, "mlflow ui did not come up"
                time.sleep(0.5)
        found = _rest(port, "/api/2.0/mlflow/runs/search",
                      {"experiment_ids": [exp_id["experiment"]["experiment_id"]], "max_results": 1000})
        def stage(r):
            return next((t["value"] for t in r["data"].get("tags", []) if t["key"] == "stage"), None)

        names = sorted(r["info"]["run_name"] for r in found["runs"]
                       if r["info"]["status"] == "FINISHED" and stage(r) != "trial")
        assert names == sorted([*expected_run_names(), "study/smoke"])
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=30)

    snakemake(repo, "--report", "report.html", *SMOKE)
    assert (repo / "report.html").stat().st_size > 10_000


@pytest.mark.slow
def test_snakemake_study_on_an_encoder_decoder_hub_pair(repo):
    """A tiny random T5 pair saved to local directories and named under `models.hub_pairs` (its kind is
    detected, not configured): the Snakemake study runs end to end with no training — data, DIMR over
    the decoder, thresholds, decodes, evaluation, report."""
    import torch
    import transformers as tf
    from test_seq2seq import build_seq2seq_pair

    run([str(BIN / "viasd"), "prepare-data", "--params", "params.yaml", "--config", "config/smoke.yaml",
         "--only", "corpus"], repo)
    tokenizer = tf.AutoTokenizer.from_pretrained(repo / "data-smoke" / "tokenizer")
    torch.manual_seed(0)
    target, draft = build_seq2seq_pair(repo / "t5", "t5", tokenizer)
    (repo / "t5.yaml").write_text(yaml.safe_dump({
        "models": {"hub_pairs": {"t5": {"target": str(target), "draft": str(draft), "dtype": "float32"}}},
        "study": {"name": "t5", "pairs": ["t5"], "runs": ["ar", "sd", "cascade_sd", "viasd", "viasd-mask_random"]}}))
    snakemake(repo, "--cores", "2", "all", "--configfile", "config/smoke.yaml", "t5.yaml", timeout=1200)
    assert not (repo / "models-smoke" / "smoke").exists()  # nothing trained
    mask = json.loads((repo / "models-smoke" / "masks" / "t5" / "mask.json").read_text())
    assert len(mask["keep_layers"]) == 2 and mask["num_layers"] == 4  # half of the decoder's 4 layers
    rows = {row[0]: row for row in md_rows((repo / "reports-smoke" / "tables" / "t5-stdlib_continuation.md").read_text())}
    assert {"ar", "sd", "cascade_sd", "viasd", "viasd-mask_random"} <= set(rows)
    sd = json.loads((repo / "reports-smoke" / "eval" / "t5" / "stdlib_continuation" / "sd.json").read_text())
    assert sd["quality"]["fidelity"] == 1.0
    # encoder-decoder pairs do not decode in batches: the batch table says so, and the report with it
    batch = json.loads((repo / "reports-smoke" / "batch" / "t5" / "stdlib_continuation" / "batch.json").read_text())
    assert batch["off"] and batch["unsupported"] and "encoder-decoder" in batch["reason"]
    assert "not measured, this pair does not decode in batches" in (repo / "reports-smoke" / "summary.md").read_text()
    # viasd bench on the pair: every method and transformers' greedy and assisted generation, same outputs
    run([str(BIN / "viasd"), "bench", "--params", "params.yaml", "--config", "config/smoke.yaml", "--config", "t5.yaml",
         "--no-track", "--pair", "t5", "--prompts", "2", "--repeats", "1", "--max-new-tokens", "8"], repo)
    bench = json.loads(next((repo / "reports-smoke" / "bench").glob("t5-stdlib_continuation*.json")).read_text())
    assert {"hf_ar", "hf_assisted", "ar", "sd", "cascade_sd", "spec_cascade", "viasd"} <= set(bench["methods"])


def test_explicit_targets_on_a_fresh_clone_plan_their_jobs(tmp_path):
    """`snakemake <outputs>` on a fresh clone (no `.viasd/params` yet) plans the jobs that build them: every rule's
    parameter slice is written before the DAG is built, so none is missing while Snakemake looks for it (before, the
    third model's folder was reported missing on the first run of these targets)."""
    from workflow_helpers import copy_repo

    repo = copy_repo(tmp_path / "repo")
    targets = ["models-smoke/smoke/target", "models-smoke/smoke/draft", "models-smoke/smoke/independent",
               "models-smoke/masks/smoke"]
    planned = snakemake(repo, "-n", "--cores", "2", *targets, *SMOKE)
    rules = planned_rules(planned.stdout + planned.stderr)
    assert rules == {"prepare_corpus", "train_model", "dimr_search"}, rules
    assert {p.name for p in (repo / ".viasd" / "params" / "train_model").iterdir()} == {"target", "draft", "independent"}
