"""The MLflow UI a user opens on a study's store lands on the study's runs: a real `mlflow server` on the
store our tracking code writes, and the page loaded in a real browser (Debian's `chromium`, headless;
`.ci/run` installs it)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from viasd.study import tracking

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# what a closed network needs (without them Chromium's background connections fail at every start)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
RUNS = ["decode/smoke/stdlib_continuation/sd", "decode/smoke/stdlib_continuation/viasd", "tune_thresholds/smoke"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url: str, proc: subprocess.Popen, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"mlflow server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer in {seconds} s")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_the_mlflow_ui_opens_the_study_on_its_runs(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(tracking.PARENT_ENV, raising=False)
    (tmp_path / "params.yaml").write_text("seed: 0\n")
    tracking.init_store(tmp_path, "viasd-smoke")
    for name in RUNS:
        pair, task = "smoke", "stdlib_continuation"
        assert tracking.record_run(tmp_path, "viasd-smoke", name, {"gamma": 4}, {"speedup_vs_ar": 1.4, "fidelity": 1.0},
                                   {"stage": name.split("/")[0], "pair": pair, "task": task})
    from mlflow.tracking import MlflowClient

    # the report's comparison as the experiment's description (viasd report does this after the study)
    from viasd.report.overview import experiment_overview

    ratio = lambda r: {"ratio": r, "low": r - 0.1, "high": r + 0.1}  # noqa: E731
    headline = {"smoke": {"stdlib_continuation": {
        "sd": {"gamma": 3, "vs_ar": ratio(1.31), "vs_sd_best": ratio(1.0), "fidelity": 1.0, "task_drop": 0.0,
               "rejection_rate": 0.55},
        "viasd": {"gamma": 3, "vs_ar": ratio(1.52), "vs_sd_best": ratio(1.16), "fidelity": 0.981, "task_drop": -0.42,
                  "rejection_rate": 0.31}}}}
    tracking.describe_experiment(tmp_path, "viasd-smoke", lambda exp_id: experiment_overview(
        "smoke", headline, None, f"#/experiments/{exp_id}/runs?workflowType=machine_learning"))
    experiment = MlflowClient(tracking.tracking_uri(tmp_path)).get_experiment_by_name("viasd-smoke")
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                               tracking.tracking_uri(tmp_path), "--host", "127.0.0.1", "--port", str(port),
                               "--workers", "1"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_for(f"http://127.0.0.1:{port}/health", server)
        page = tracking.ui_page(experiment.experiment_id, f"http://127.0.0.1:{port}")
        dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'chromium'}",
                              "--virtual-time-budget=30000", "--dump-dom", page],
                             capture_output=True, text=True, timeout=180).stdout
        # the page the UI's home leads to (a click on the experiment): its GenAI overview, which shows the
        # description first: the headline line, and the comparison of every run beneath it
        first = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'chromium-home'}",
                                "--virtual-time-budget=30000", "--dump-dom",
                                f"http://127.0.0.1:{port}/#/experiments/{experiment.experiment_id}"],
                               capture_output=True, text=True, timeout=180).stdout
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert "viasd-smoke" in dom and "matching runs" in dom, dom[-3000:]  # the runs table, not the GenAI overview
    missing = [name for name in RUNS if name not in dom]
    assert not missing, f"the runs table does not list {missing}: {Path(tmp_path / 'dom.html').write_text(dom)}"
    assert "smoke/stdlib_continuation: viasd 1.16× [1.06, 1.26] vs SD" in first, first[-3000:]
    assert "<table>" in first and "1.520× [1.420, 1.620]" in first and "0.981" in first
