"""MLflow runs at the stage boundary: standard source tags, a dirty tree marked, stage runs nested
under the parent run of their workflow invocation."""

from __future__ import annotations

import subprocess

from viasd import tracking


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
