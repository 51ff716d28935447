"""The MLflow UI on a study's store, as a user reaches it: a real `mlflow server` on the store our tracking code
writes, each page loaded in a real browser (Debian's `chromium`, headless; `.ci/run` installs it) and read as it
shows once its scripts have run."""

from __future__ import annotations

import html
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from viasd.study import mlflow_view, tracking

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# what a closed network needs (without them Chromium's background connections fail at every start)
FLAGS = ["--headless", "--no-sandbox", "--window-size=2560,1440", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


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


def _dump(url: str, profile: Path) -> str:
    """The page as a user's browser shows it once its scripts have run (a fresh profile: the UI's default mode)."""
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=30000",
                           "--dump-dom", url], capture_output=True, text=True, timeout=180).stdout


def _href(dom: str, text: str) -> str:
    """The target of the link whose text is `text` (what a click on it opens), entities decoded."""
    found = re.search(r'<a [^>]*href="([^"]*)"[^>]*>' + re.escape(text) + "</a>", dom)
    assert found, f"no link {text!r} on the page: {dom[-3000:]}"
    return html.unescape(found.group(1))


def _text(dom: str) -> str:
    body = re.sub(r"<(script|style)[^>]*>.*?</\1>", "", dom, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)))


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_the_mlflow_ui_compares_the_study_runs_from_the_experiment_page(tmp_path, monkeypatch):
    """The path a user takes: the UI's home -> the experiment (the page MLflow opens, with the report's description
    on top: the headline and every run's figures) -> "compare the runs": the compared runs as rows of the runs table
    with their figures as columns, though the workflow's parent run nests them -> "as charts": speed against
    quality."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "params.yaml").write_text("seed: 0\n")
    tracking.init_store(tmp_path, "viasd-smoke")
    parent = tracking.open_run(tmp_path, "viasd-smoke", "study/smoke", {"stage": "study"}, nested=False)
    monkeypatch.setenv(tracking.PARENT_ENV, parent)
    pair, task = "smoke", "stdlib_continuation"
    figures = {"sd": (1.31, 1.0, 0.0, 0.55), "viasd": (1.52, 0.981, -0.42, 0.31)}
    for run, (speed, fidelity, drop, rejection) in figures.items():
        tags = {"pair": pair, "task": task, "run": run, "ablation": "none"}
        assert tracking.record_run(tmp_path, "viasd-smoke", f"decode/{pair}/{task}/{run}", {"gamma": 3},
                                   {"speedup_vs_ar": speed}, {"stage": "decode", **tags})
        for attempt in (1, 2):  # an evaluation re-run: the view shows the newest
            assert tracking.record_run(tmp_path, "viasd-smoke", f"evaluate/{pair}/{task}/{run}", {"gamma": 3},
                                       {"speed.vs_ar.ratio": speed, "quality.fidelity": fidelity,
                                        "quality.task_drop": drop, "rejection_rate": rejection,
                                        "attempt": attempt}, {"stage": "evaluate", **tags})
    report = tracking.record_run(tmp_path, "viasd-smoke", "report", {}, {"runs": 2}, {"stage": "report"})
    ratio = lambda r: {"ratio": r, "low": r - 0.1, "high": r + 0.1}  # noqa: E731
    headline = {pair: {task: {
        run: {"gamma": 3, "vs_ar": ratio(speed), "vs_sd_best": ratio(round(speed / 1.31, 2)), "fidelity": fidelity,
              "task_drop": drop, "rejection_rate": rejection}
        for run, (speed, fidelity, drop, rejection) in figures.items()}}}
    # what `viasd report` does after the study
    assert mlflow_view.publish_comparison(tmp_path, "viasd-smoke", "smoke", headline, report) == 2
    # the view's link, which `viasd tracking-init` prints at every Snakemake start once a report has made it
    assert mlflow_view.compare_view_page(tmp_path, "viasd-smoke") == \
        "http://127.0.0.1:5000/#/experiments/1/runs?viewStateShareKey=viasd-compare&workflowType=machine_learning"
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                               tracking.tracking_uri(tmp_path), "--host", "127.0.0.1", "--port", str(port),
                               "--workers", "1"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ui = f"http://127.0.0.1:{port}/"
    try:
        _wait_for(f"{ui}health", server)
        home = _dump(ui, tmp_path / "chromium")
        experiment = _href(home, "viasd-smoke")
        first = _dump(ui + experiment, tmp_path / "chromium")
        view = _dump(ui + _href(first, "compare the runs"), tmp_path / "chromium")
        charts = _dump(ui + _href(first, "as charts"), tmp_path / "chromium")
    finally:
        server.terminate()
        server.wait(timeout=30)
    # the experiment's page: the headline, then every run's figures
    assert "smoke/stdlib_continuation: viasd 1.16× [1.06, 1.26] vs SD" in first, first[-3000:]
    assert "<table>" in first and "1.520× [1.420, 1.620]" in first and "0.981" in first
    # the view: one row per compared run (the newest evaluation), its figures as columns, no other run
    text = _text(view)
    assert "Error loading shared view state" not in text, text[-2000:]
    assert "2 matching runs" in text, text[-3000:]
    for column in ("speed.vs_ar.ratio", "speed.vs_sd_best.ratio", "quality.fidelity", "quality.task_drop",
                   "rejection_rate"):
        assert column in text, f"no column {column}: {text[-3000:]}"
    assert f"evaluate/{pair}/{task}/viasd" in text and f"evaluate/{pair}/{task}/sd" in text
    assert "decode/" not in text and "study/smoke" not in text
    assert "1.52" in text and "0.981" in text and "1.16" in text and "-0.42" in text
    assert text.index(f"evaluate/{pair}/{task}/viasd") < text.index(f"evaluate/{pair}/{task}/sd")  # by speed
    # the charts: speed against fidelity, the gain over SD against task drop
    chart_text = _text(charts)
    assert "Error loading shared view state" not in chart_text
    for title in ("quality.fidelity vs. speed.vs_ar.ratio", "quality.task_drop vs. speed.vs_sd_best.ratio"):
        assert title in chart_text, f"no chart {title}: {chart_text[-3000:]}"
    assert charts.count("scatterlayer") == 2 and charts.count('class="point"') >= 2, "the scatter charts drew no points"
