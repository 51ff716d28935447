"""The study past one machine, on real services started here (tests/cluster_services.py): a one-node
SLURM cluster running the README's cluster command through profiles/slurm, an MLflow tracking server on
PostgreSQL that every job logs to, and searches fanned out over workers sharing a PostgreSQL Optuna
storage. Marked slow; `.ci/run` installs the Debian packages."""

from __future__ import annotations

import glob
import json
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from cluster_services import (
    create_database,
    free_port,
    require,
    slurm_jobs,
    start_mlflow_server,
    start_postgres,
    start_slurm,
    stop,
    stop_postgres,
    stop_slurm,
    wait_for,
)
from workflow_helpers import BIN, GOLDEN, REPO, expected_run_names, run, smoke_fingerprint, tool_env

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    require("slurmctld", "slurmd", "/usr/sbin/munged", "squeue")
    folder = tmp_path_factory.mktemp("slurm")
    env = start_slurm(folder)
    yield env
    stop_slurm(folder)


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    require("runuser", *(glob.glob("/usr/lib/postgresql/*/bin/initdb")[:1] or ["initdb"]))
    folder = Path(tempfile.mkdtemp(prefix="viasd-postgres-"))  # beside pytest's folders, which postgres cannot enter
    url, bindir = start_postgres(folder)
    yield url
    stop_postgres(folder, bindir)
    shutil.rmtree(folder, ignore_errors=True)



def readme_cluster_section() -> tuple[str, list[str]]:
    """The README's "On a SLURM cluster" section and the `snakemake` command of its code block."""
    text = (REPO / "README.md").read_text()
    section = text.split("### On a SLURM cluster", 1)[1].split("\n### ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    commands = [shlex.split(line) for line in lines if line.startswith("snakemake ")]
    assert len(commands) == 1, "the README's cluster section shows one snakemake command"
    return section, commands[0]


def _sbatch_rules(jobs: list[dict]) -> set[str]:
    return {re.match(r"rule_([a-z_]+?)(_wildcards_.*)?$", j["comment"]).group(1) for j in jobs}


def test_the_slurm_profile_is_consistent():
    """Threads are the CPUs a job asks for (no cpus_per_task overriding them), no GPU is given in the
    profile (the rules ask for one when models.device is cuda), every set-threads rule exists."""
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    assert "cpus_per_task" not in profile.get("default-resources", {})
    for rule, resources in (profile.get("set-resources") or {}).items():
        assert "cpus_per_task" not in resources and "gpu" not in resources, rule
    rules = set(re.findall(r"^rule (\w+):", "\n".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk")),
                           re.M))
    assert set(profile["set-threads"]) <= rules
    assert "MLFLOW_TRACKING_URI" in profile["envvars"]
    section, command = readme_cluster_section()
    assert "profiles/slurm" in command and "MLFLOW_TRACKING_URI" in section and "mlflow server" in section


def test_smoke_study_through_slurm_logging_to_a_postgresql_tracking_server(repo, slurm, postgres, tmp_path):
    """The README's cluster command on a one-node SLURM cluster, every job an sbatch job logging to an
    `mlflow server` on PostgreSQL; a job cancelled with scancel mid-run, the same command run again:
    the same masks, searched policies and tokens as the local smoke study (tests/golden/), every stage's
    run FINISHED exactly once and none left RUNNING, and a third run has nothing to do."""
    port = free_port()
    server = start_mlflow_server(BIN, create_database(postgres, "mlflow"), tmp_path / "artifacts", port,
                                 tmp_path / "mlflow.log")
    uri = f"http://127.0.0.1:{port}"
    env = {**tool_env(), **slurm, "MLFLOW_TRACKING_URI": uri}
    _, command = readme_cluster_section()
    command = [str(BIN / command[0]), *command[1:]]
    try:
        log = (tmp_path / "first.log").open("w")
        first = subprocess.Popen(command, cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT)

        from mlflow.tracking import MlflowClient

        client = MlflowClient(uri)

        def open_stage_run(job_id: str):  # the job's stage run, RUNNING from the stage's start (tracking.owner_tags)
            exp = client.get_experiment_by_name("viasd-smoke")
            found = exp and client.search_runs(
                [exp.experiment_id], f"tags.`viasd.slurm_job` = '{job_id}' and attributes.status = 'RUNNING'")
            return next((r for r in found or [] if r.info.run_name.startswith("tune_thresholds/")), None)

        def frozen_mid_stage():
            """A threshold search job (thresholds.split_searches: a job of its own) frozen by `scontrol suspend`
            (SIGSTOP to its processes) while its stage's MLflow run is open, so the cancel lands mid-stage
            whatever the machine's speed: a smoke search can end within seconds of starting, and a cancel
            timed by a sleep once landed after its run had FINISHED."""
            searches = [j for j in slurm_jobs(slurm) if j["comment"].startswith("rule_thresholds_search")
                        and j["state"] == "RUNNING"]
            for job in searches:
                if open_stage_run(job["id"]) is None:
                    continue
                if subprocess.run(["scontrol", "suspend", job["id"]], env=env, capture_output=True).returncode != 0:
                    continue  # it ended in between
                time.sleep(1)  # slurmd stops its processes: from here its run's status cannot change
                if not [j for j in slurm_jobs(slurm) if j["id"] == job["id"] and j["state"] == "SUSPENDED"]:
                    continue
                opened = open_stage_run(job["id"])
                if opened is not None:
                    return job, opened
                subprocess.run(["scontrol", "resume", job["id"]], env=env, capture_output=True)
            return None

        job, opened = wait_for(frozen_mid_stage, "a search job with its stage run open", timeout=900, proc=first)
        subprocess.run(["scancel", job["id"]], env=env, check=True)
        assert first.wait(timeout=600) != 0  # the workflow fails with its job
        cancelled = [j for j in slurm_jobs(slurm) if j["id"] == job["id"]]
        assert cancelled and cancelled[0]["state"] == "CANCELLED"

        second = run(command, repo, timeout=1800, env=env)
        jobs = slurm_jobs(slurm)
        expected = {"prepare_corpus", "prepare_task", "train_model", "dimr_search", "train_router", "thresholds_search",
                    "tune_thresholds", "decode", "batch_table", "evaluate", "report"}
        assert _sbatch_rules(jobs) == expected  # every rule ran as an sbatch job
        assert all(j["state"] == "COMPLETED" for j in jobs if j["id"] != job["id"] and j["state"] != "CANCELLED")
        assert any(j["comment"] == job["comment"] and j["state"] == "COMPLETED" for j in jobs)  # the cancelled search
        # ran again
        assert (repo / "reports-smoke" / "summary.md").exists()

        # the same study as the local run (masks, searched policies, timing-free tokens, run names)
        fingerprint = smoke_fingerprint(repo, tracking_uri=uri)
        golden = json.loads(GOLDEN.read_text())
        for key in ("masks", "searched_policies", "tokens"):
            assert fingerprint[key] == golden[key], f"through SLURM, the smoke study's {key} differs"
        # the run names too, but a trial the cancel interrupted keeps its Optuna number, so the resumed
        # search's trial runs may be numbered past it: their count must match, not their numbers
        def names(found):
            return sorted(n for n in found if not n.startswith("trial ")), sum(n.startswith("trial ") for n in found)

        assert names(fingerprint["mlflow_run_names"]) == names(golden["mlflow_run_names"])

        exp = client.get_experiment_by_name("viasd-smoke")
        runs = client.search_runs([exp.experiment_id], max_results=5000)
        assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
        finished = [r for r in runs if r.info.status == "FINISHED" and r.data.tags.get("stage") not in ("study", "trial")]
        assert sorted(r.info.run_name for r in finished) == expected_run_names()  # each exactly once
        killed = [r for r in runs if r.info.status == "KILLED"]
        assert killed and all(r.info.run_name.startswith("tune_thresholds/") for r in killed)
        cancelled_run = client.get_run(opened.info.run_id)  # ended by the job that ran the search again
        assert cancelled_run.info.status == "KILLED" and cancelled_run.data.tags.get("viasd.superseded_by")
        assert all(r.data.tags.get("viasd.slurm_job") for r in finished)  # logged from the sbatch jobs
        parents = {r.info.run_id: r.info.status for r in runs if r.data.tags.get("stage") == "study"}
        assert sorted(parents.values()) == ["FAILED", "FINISHED"]
        assert {parents.get(r.data.tags.get("mlflow.parentRunId")) for r in finished} <= {"FAILED", "FINISHED"}
        assert not (repo / "mlflow.db").exists()  # nothing went to a local store

        third = run(command, repo, timeout=600, env=env)
        assert "Nothing to be done" in third.stdout + third.stderr
        assert second.returncode == 0
    finally:
        stop(server)


def test_searches_fanned_out_over_workers_on_a_postgresql_storage(repo, postgres):
    """dimr.workers and thresholds.workers 2 on the smoke study, the Optuna storage on PostgreSQL: each
    search's worker jobs run, then its own job picks from the storage, where exactly n trials completed
    with no point run twice."""
    import optuna

    storage = create_database(postgres, "optuna")
    (repo / "config" / "workers.yaml").write_text(yaml.safe_dump({
        "study": {"optuna_storage": storage, "optuna_heartbeat": 5}, "dimr": {"workers": 2},
        "thresholds": {"workers": 2}}))
    target = "models-smoke/thresholds/smoke-stdlib_continuation"
    run([str(BIN / "snakemake"), "--cores", "2", target, "--configfile", "config/smoke.yaml", "config/workers.yaml"],
        repo, timeout=1800)
    for marker in ("dimr/smoke/worker-1.json", "dimr/smoke/worker-2.json",
                   "thresholds/smoke-stdlib_continuation/worker-1.json",
                   "thresholds/smoke-stdlib_continuation/worker-2.json"):
        assert json.loads((repo / "models-smoke" / "workers" / marker).read_text())["workers"] == 2
    smoke = yaml.safe_load((repo / "config" / "smoke.yaml").read_text())
    budgets = {"dimr": smoke["dimr"]["n_random"] + smoke["dimr"]["n_bayes"],
               "thresholds-smoke-stdlib_continuation-main": smoke["thresholds"]["n_trials"],
               "thresholds-smoke-stdlib_continuation-rules": smoke["thresholds"]["rules_trials"]}
    studies = {s.study_name: s for s in optuna.get_all_study_summaries(storage)}
    for prefix, n in budgets.items():
        names = [name for name in studies if name.startswith(prefix)]
        assert names, f"no study {prefix}-* in {sorted(studies)}"
        for name in names:
            trials = optuna.load_study(study_name=name, storage=storage).get_trials(
                states=(optuna.trial.TrialState.COMPLETE,))
            assert len(trials) == n, name
            assert len({json.dumps(t.params, sort_keys=True) for t in trials}) == n, name
    main = json.loads((repo / target / "main.json").read_text())
    assert main["trials"] == smoke["thresholds"]["n_trials"]
    mask = json.loads((repo / "models-smoke" / "masks" / "smoke" / "mask.json").read_text())
    assert mask["trials"] == budgets["dimr"]
