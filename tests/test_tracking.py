"""MLflow runs at the stage boundary: standard source tags, a dirty tree marked, stage runs nested
under the parent run of their workflow invocation."""

from __future__ import annotations

import subprocess

from viasd.study import pending_runs, tracking


def _git(cwd, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_stage_runs_nest_under_the_invocation_parent_and_carry_source_tags(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    (tmp_path / "params.yaml").write_text("seed: 0\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "x")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    parent = tracking.open_run(tmp_path, "viasd-t", "study/t", {"stage": "study"})
    monkeypatch.setenv(tracking.PARENT_ENV, parent)
    child = tracking.record_run(tmp_path, "viasd-t", "decode/p/t/ar", {"a": 1}, {"m": 0.5}, {"stage": "decode"})
    (tmp_path / "params.yaml").write_text("seed: 1\n")  # an uncommitted change to a tracked file
    monkeypatch.delenv(tracking.PARENT_ENV)
    flat = tracking.record_run(tmp_path, "viasd-t", "report", {}, {}, {"stage": "report"})
    tracking.close_run(tmp_path, parent, "FAILED")
    client = MlflowClient(tracking.tracking_uri(tmp_path))
    child_tags, flat_tags = client.get_run(child).data.tags, client.get_run(flat).data.tags
    assert child_tags["mlflow.parentRunId"] == parent and "mlflow.parentRunId" not in flat_tags
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert child_tags["mlflow.source.git.commit"] == commit == flat_tags["git_commit"]
    assert (child_tags["git_dirty"], flat_tags["git_dirty"]) == ("false", "true")
    assert child_tags["mlflow.source.name"] == "viasd decode"
    assert client.get_run(parent).info.status == "FAILED" and client.get_run(child).info.status == "FINISHED"


def test_a_stage_run_is_open_while_it_runs_and_failed_with_the_error_on_a_crash(tmp_path, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient
    from study_fixtures import smoke_params

    from viasd.cli import main

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    path = smoke_params(tmp_path)
    assert main(["decode", "--params", str(path), "--task", "stdlib_continuation", "--run", "sd"]) == 2
    assert "viasd: error:" in capsys.readouterr().err
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("viasd-smoke")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI opens on its runs
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FAILED" and run.info.run_name == "decode/stdlib_continuation/sd"
    assert run.data.tags["stage"] == "decode"
    assert "run `viasd prepare-data` first" in run.data.tags["error"]  # the message the user saw


def test_a_run_the_store_cannot_take_is_kept_and_delivered_once(tmp_path, monkeypatch):
    """With the tracking server down while a stage ends, the stage's run is kept in .viasd/pending-runs
    (its trials with it) and a warning names the store; once a real `mlflow server` answers, the next
    viasd command (here tracking-init, Snakemake's onstart) records it, nested trials included, exactly
    once."""
    import argparse
    import socket
    import sys
    import time
    import urllib.request

    from mlflow.tracking import MlflowClient
    from study_fixtures import smoke_params

    from viasd import config
    from viasd.cli import main
    from viasd.cli.common import track
    from viasd.study.record import StageRecord

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    monkeypatch.delenv(tracking.PARENT_ENV, raising=False)
    path = smoke_params(tmp_path)
    params = config.load(path)
    args = argparse.Namespace(params=path, no_track=False, run_id=None, pair=None)
    record = StageRecord("decode", "decode/smoke/stdlib_continuation/sd", {"gamma": 4}, {"speedup_vs_ar": 1.4},
                         {"run": "sd"}, children=[{"name": "trial/0", "params": {"a": 1}, "metrics": {"m": 2.0}}])
    track(args, params, record)  # the server is down
    pending = list((tmp_path / pending_runs.PENDING).glob("*.json"))
    assert len(pending) == 1
    store = tmp_path / "server"
    store.mkdir()

    def start_server():
        server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                                   f"sqlite:///{store / 'mlflow.db'}", "--host", "127.0.0.1", "--port", str(port),
                                   "--workers", "1"], cwd=store, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(180):
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=2)
                return server
            except OSError:
                time.sleep(0.5)
        raise AssertionError("mlflow server did not start")

    def stop(server):
        server.terminate()
        server.wait(timeout=30)

    server = start_server()
    try:
        for _ in range(2):  # the second finds nothing pending: no duplicate
            assert main(["tracking-init", "--params", str(path)]) == 0
        # a stage whose run was opened when it started, the server gone when it ends: the same run is completed
        args.run_id = opened = tracking.open_run(tmp_path, "viasd-smoke", "decode/smoke/stdlib_continuation/ar")
    finally:
        stop(server)
    track(args, params, StageRecord("decode", "decode/smoke/stdlib_continuation/ar", {}, {"speedup_vs_ar": 1.0}))
    assert len(list((tmp_path / pending_runs.PENDING).glob("*.json"))) == 1
    server = start_server()
    try:
        assert main(["tracking-init", "--params", str(path)]) == 0
        client = MlflowClient(uri)
        runs = client.search_runs([client.get_experiment_by_name("viasd-smoke").experiment_id])
    finally:
        stop(server)
    assert not list((tmp_path / pending_runs.PENDING).glob("*.json"))
    stage = [r for r in runs if r.info.run_name == "decode/smoke/stdlib_continuation/sd"]
    trials = [r for r in runs if r.info.run_name == "trial/0"]
    assert len(stage) == 1 and stage[0].info.status == "FINISHED" and stage[0].data.metrics["speedup_vs_ar"] == 1.4
    assert len(trials) == 1 and trials[0].data.tags["mlflow.parentRunId"] == stage[0].info.run_id
    ar = [r for r in runs if r.info.run_name == "decode/smoke/stdlib_continuation/ar"]
    assert [(r.info.run_id, r.info.status) for r in ar] == [(opened, "FINISHED")]  # none left RUNNING, none twice
