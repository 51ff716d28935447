"""Searches shared by several worker processes on one Optuna storage (viasd/search/workers.py): real
processes on a real SQLite storage with heartbeats, a worker killed with SIGKILL mid-trial."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest

from viasd.search.storage import optuna_storage
from viasd.search.workers import Worker, run_trials

# a worker process: run_trials on the study `search` of the storage, an objective of two floats that
# takes `SECONDS` per trial; with HANG set, the first trial writes its params there and never returns
WORKER = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    import optuna
    from viasd.search.storage import optuna_storage
    from viasd.search.workers import Worker, run_trials

    db, index, count, n_trials, heartbeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    seconds, hang = float(os.environ.get("SECONDS_PER_TRIAL", "0.2")), os.environ.get("HANG")
    storage = optuna_storage(None, Path(db), Path(db).parent, heartbeat)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=storage, study_name="search", load_if_exists=True)
    worker = Worker(index, count)

    def evaluate(trial):
        x, y = trial.suggest_float("x", -1, 1), trial.suggest_float("y", -1, 1)
        trial.set_user_attr("worker", index)
        if hang:
            Path(hang).write_text(json.dumps(trial.params))
            time.sleep(3600)
        time.sleep(seconds)
        return x * x + y * y

    sampler = lambda n: optuna.samplers.TPESampler(seed=worker.seed(7, n), n_startup_trials=3)
    run_trials(study, storage, n_trials, sampler, evaluate, worker, poll_s=0.5)
""")


def _worker(tmp_path: Path, index: int, count: int, n_trials: int, heartbeat: int = 1, **env) -> subprocess.Popen:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / "search.db"), str(index), str(count),
                             str(n_trials), str(heartbeat)], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _trials(tmp_path: Path, state=None):
    storage = f"sqlite:///{tmp_path / 'search.db'}"
    study = optuna.load_study(study_name="search", storage=storage)
    return [t for t in study.get_trials() if state is None or t.state == state]


def _finish(proc: subprocess.Popen, timeout: float = 120) -> None:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]


def test_two_workers_finish_exactly_n_trials_with_distinct_points(tmp_path):
    n = 12
    workers = [_worker(tmp_path, i, 2, n) for i in range(2)]
    for proc in workers:
        _finish(proc)
    complete = _trials(tmp_path, optuna.trial.TrialState.COMPLETE)
    assert len(complete) == n
    points = {(t.params["x"], t.params["y"]) for t in complete}
    assert len(points) == n  # no point run twice: each worker samples with its own seed
    assert {t.user_attrs["worker"] for t in complete} == {0, 1}  # both did part of the work
    # a worker started again on the finished study runs nothing
    before = len(_trials(tmp_path))
    _finish(_worker(tmp_path, 1, 2, n))
    assert len(_trials(tmp_path)) == before


def test_a_killed_workers_trial_is_failed_and_retried(tmp_path):
    n = 4
    hung = tmp_path / "hung.json"
    victim = _worker(tmp_path, 0, 2, n, HANG=str(hung))
    deadline = time.monotonic() + 60
    while not hung.exists():
        assert time.monotonic() < deadline, victim.stderr.read() if victim.poll() is not None else "no trial started"
        time.sleep(0.1)
    os.kill(victim.pid, signal.SIGKILL)  # mid-trial: its trial stays RUNNING, its heartbeat stops
    victim.wait()
    params = json.loads(hung.read_text())
    survivor = _worker(tmp_path, 1, 2, n)
    _finish(survivor)
    trials = _trials(tmp_path)
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(complete) == n
    assert [t.params for t in failed] == [params]  # the killed worker's trial, failed as stale
    retried = [t for t in complete if t.system_attrs.get("failed_trial") == failed[0].number]
    assert len(retried) == 1 and retried[0].params == params  # ... and its point run again
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]


def test_one_worker_runs_what_the_study_lacks_and_resumes(tmp_path):
    """The serial search (one worker): exactly n trials, resumed after an interruption with the sampler
    reseeded by the trials completed, so a resumed run equals an uninterrupted one."""
    def search(db: Path, stop_after: int | None = None):
        storage = optuna_storage(None, db, tmp_path)
        study = optuna.create_study(storage=storage, study_name="s", load_if_exists=True)
        calls = []

        def evaluate(trial):
            if stop_after is not None and len(calls) == stop_after:
                raise KeyboardInterrupt
            calls.append(1)
            return trial.suggest_float("x", -1, 1) ** 2

        sampler = lambda n: optuna.samplers.TPESampler(seed=Worker().seed(3, n), n_startup_trials=2)  # noqa: E731
        try:
            return [t.params["x"] for t in run_trials(study, storage, 6, sampler, evaluate)]
        except KeyboardInterrupt:
            return None

    whole = search(tmp_path / "a.db")
    assert search(tmp_path / "b.db", stop_after=3) is None
    resumed = search(tmp_path / "b.db")
    assert len(whole) == 6 and resumed == whole


@pytest.mark.parametrize("index, count", [(2, 2), (-1, 3), (0, 0)])
def test_a_worker_index_outside_its_count_is_refused(index, count):
    with pytest.raises(ValueError, match="index must be"):
        Worker(index, count)


@pytest.mark.parametrize("command, key", [("tune-thresholds", "thresholds.workers"), ("dimr-search", "dimr.workers")])
def test_a_worker_beyond_the_configured_count_is_one_clear_error(command, key, capsys):
    from workflow_helpers import REPO

    from viasd.cli import main

    code = main([command, "--params", str(REPO / "params.yaml"), "--no-track", "--worker", "3"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == f"viasd: error: --worker 3: {key} is 1, so K must be in 1..1"


def test_no_private_optuna_name_is_used():
    """The searches go through Optuna's public API only (its loop, callbacks, storages and heartbeats)."""
    import re

    private = re.compile(r"\boptuna(\.\w+)*\._\w+|\b(study|trial|storage)\._\w+|\bfrom optuna\S* import _")
    repo = Path(__file__).resolve().parent.parent
    used = [f"{path.relative_to(repo)}:{n}" for path in (repo / "viasd").rglob("*.py")
            for n, line in enumerate(path.read_text().splitlines(), 1) if private.search(line)]
    assert not used, used


def test_optuna_dashboard_opens_a_search_storage_as_it_is(tmp_path):
    """The README's `optuna-dashboard <storage>`: a search's SQLite storage, served as it is, lists the study and
    its trials with their user attributes."""
    import shutil
    import socket
    import urllib.request

    dashboard = shutil.which("optuna-dashboard", path=str(Path(sys.executable).parent))
    assert dashboard, "optuna-dashboard is a test dependency (pyproject's test extra)"
    _finish(_worker(tmp_path, 0, 1, 3))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([dashboard, f"sqlite:///{tmp_path / 'search.db'}", "--port", str(port), "--quiet"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as response:
                    studies = json.loads(response.read())["study_summaries"]
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "optuna-dashboard did not come up"
                time.sleep(0.3)
        (study,) = [s for s in studies if s["study_name"] == "search"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{study['study_id']}", timeout=10) as response:
            trials = json.loads(response.read())["trials"]
        assert len(trials) == 3 and all(t["state"] == "Complete" for t in trials)
        assert all({a["key"] for a in t["user_attrs"]} == {"worker"} for t in trials)
    finally:
        server.terminate()
        server.wait(timeout=30)
