"""The study through DVC on a copy of the repository, as the README walks it: Snakemake and DVC agreeing on what is
up to date, `dvc repro` re-running what a parameter change touches, DVC's metrics, plots (opened in a browser),
experiments, queue and remote, and the MLflow runs of DVC's invocations."""

from __future__ import annotations

import json
import re
import time
import warnings
from pathlib import Path

import pytest
import yaml
from workflow_helpers import (
    BIN,
    CHROMIUM,
    dvc_stages,
    offline_plots_template,
    planned_rules,
    rendered_dom,
    run,
    snakemake,
    stages_run,
)

DVC_RUNS = ["ar", "sd", "viasd"]  # DVC runs stages one at a time: a smaller grid than the Snakemake test's


FRONTIER_PLOT, LOSS_PLOT = "speed against fidelity (test split, every run)", "training loss"


def _check_dvc_plots(repo: Path) -> None:
    """`dvc plots show` draws the study's series with data (the frontier's point per run, the loss curve of each
    trained model, both searches' trials); the HTML, opened in headless Chromium, draws every chart."""
    shown = json.loads(run([str(BIN / "dvc"), "plots", "show", "--json"], repo).stdout)["data"]

    def values(plot: str) -> list[dict]:
        return [v for item in shown[plot] for v in item["content"]["data"]["values"]]

    frontier = values(FRONTIER_PLOT)
    assert {v["run"] for v in frontier} == set(DVC_RUNS) and all(float(v["speedup_vs_ar"]) > 0 for v in frontier)
    assert all(0 < float(v["fidelity"]) <= 1 for v in frontier)
    loss = values(LOSS_PLOT)
    assert {v["filename"].rsplit("-", 1)[-1] for v in loss} == {"target.csv", "draft.csv", "independent.csv"}
    assert all(float(v["loss"]) > 0 for v in loss) and len(loss) > 3 * 5
    dimr = values("DIMR search (best mask cost so far)")
    assert len(dimr) > 2 and float(dimr[-1]["best_cost"]) <= float(dimr[0]["best_cost"])
    assert any(v["fidelity"] for v in values("threshold search trials (dev split; cost per token in ms)"))

    template = offline_plots_template(Path.home() / ".cache" / "viasd-tests" / "vega")
    if CHROMIUM is None or template is None:
        warnings.warn("the DVC plots were not opened in a browser: no chromium, or npm could not fetch Vega", stacklevel=2)
        return
    run([str(BIN / "dvc"), "plots", "show", "-o", "dvc_plots", "--html-template", str(template)], repo)
    dom = rendered_dom(repo / "dvc_plots" / "index.html")
    # every chart drew as SVG: the two scatter plots' points, the DIMR line and a loss line per trained model
    vega = [plot for plot, items in shown.items() if items[0]["type"] == "vega"]
    assert len(re.findall(r'<svg[^>]*class="marks"', dom)) == len(vega) == 4, dom[-3000:]
    assert dom.count('class="mark-symbol role-mark marks"') == 2
    assert dom.count('class="mark-line role-mark layer_0_layer_0_marks"') == 1 + 3
    assert dom.count("<path") > len(frontier)


@pytest.mark.slow
def test_dvc_repro_reruns_only_what_a_parameter_change_touches(repo):
    """The README's path: the study through Snakemake; DVC then finds it current, an edited decode parameter
    re-runs exactly decode, evaluate and report under `dvc repro`, and Snakemake then finds nothing to do (and
    the other way round); then DVC's metrics, experiments, queue and remote on the same study."""
    (repo / "grid.yaml").write_text(yaml.safe_dump({"study": {"runs": DVC_RUNS}}))
    run([str(BIN / "viasd"), "resolve-params", "--config", "config/smoke.yaml", "--config", "grid.yaml",
         "-o", "params.yaml"], repo)
    snakemake(repo, "--cores", "2", "all", timeout=1200)
    assert (repo / "reports-smoke" / "summary.md").exists()
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]  # recorded by the run's success
    assert {"prepare_corpus", "train_draft", "report"} <= set(lock) and len(lock) == len(dvc_stages(repo))
    assert "Data and pipelines are up to date" in run([str(BIN / "dvc"), "status"], repo).stdout
    _check_dvc_plots(repo)

    params = yaml.safe_load((repo / "params.yaml").read_text())
    gamma = params["decode"]["gamma"]
    params["decode"]["gamma"] = gamma + 1
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    ran = stages_run(run([str(BIN / "dvc"), "repro"], repo, timeout=1200).stdout)
    # one decode and one evaluate stage per pair x task (every run of the grid in it)
    assert ran == {"decode@smoke-stdlib_continuation", "evaluate@smoke-stdlib_continuation", "report"}, ran
    assert "Data and pipelines are up to date" in run([str(BIN / "dvc"), "status"], repo).stdout
    again = snakemake(repo, "-n", "all")
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]
    # and the other way round: Snakemake re-runs the same three, and DVC then finds them current
    params["decode"]["gamma"] = gamma
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    planned = snakemake(repo, "-n", "all")
    assert planned_rules(planned.stdout + planned.stderr) == {"decode", "evaluate", "report", "all"}
    snakemake(repo, "--cores", "2", "all")
    assert "Data and pipelines are up to date" in run([str(BIN / "dvc"), "status"], repo).stdout
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    gamma_locked = next(p for p in lock["decode@smoke-stdlib_continuation"]["params"].values())["decode"]["gamma"]
    assert gamma_locked == gamma

    # the MLflow tags carry the hashes DVC recorded for the same inputs
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("viasd-smoke")
    tags = client.search_runs([exp.experiment_id], "tags.mlflow.runName = 'decode/smoke/stdlib_continuation/viasd'")[0].data.tags
    deps = {d["path"]: d["md5"] for d in lock["decode@smoke-stdlib_continuation"]["deps"]}
    assert tags["dvc_md5.model.target"] == deps["models-smoke/smoke/target"]
    assert tags["dvc_md5.thresholds"] == deps["models-smoke/thresholds/smoke-stdlib_continuation"]
    # one parent run for the DVC invocation: its stages' runs nested under it, FINISHED with the last stage
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("stage") == "study" and "viasd.dvc_invocation" in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    nested = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert {r.data.tags.get("stage") for r in nested} == {"decode", "evaluate", "report"}

    # the study's headline is DVC's metrics file; an experiment on a parameter re-runs what it touches only
    metrics = json.loads(run([str(BIN / "dvc"), "metrics", "show", "--json"], repo).stdout)
    assert "vs_sd_best" in json.dumps(metrics) and "fidelity" in json.dumps(metrics)
    # (gamma + 1 ran above: DVC's run cache would restore its outputs without running a stage)
    gamma = yaml.safe_load((repo / "params.yaml").read_text())["decode"]["gamma"] + 1
    exp = run([str(BIN / "dvc"), "exp", "run", "-S", f"decode.gamma={gamma + 1}", "-n", "gamma-up"], repo, timeout=1200)
    second = stages_run(exp.stdout)
    assert second and {name.split("@")[0] for name in second} == {"decode", "evaluate", "report"}
    # one decode and one evaluate stage per pair x task (every run of the grid in it)
    assert second == {"decode@smoke-stdlib_continuation", "evaluate@smoke-stdlib_continuation", "report"}
    assert all((repo / "reports-smoke" / "eval" / "smoke" / "stdlib_continuation" / f"{r}.json").exists() for r in DVC_RUNS)
    shown = run([str(BIN / "dvc"), "exp", "show", "--md", "--no-pager"], repo).stdout
    assert "vs_sd_best" in shown and "decode.gamma" in shown, shown[:2000]
    params = yaml.safe_load((repo / "params.yaml").read_text())
    assert params["decode"]["gamma"] == gamma + 1

    # a queued experiment runs in a temporary workspace that DVC deletes: its runs reach the same store
    def decodes():
        return [r for r in client.search_runs([exp_id], "tags.mlflow.runName = 'decode/smoke/stdlib_continuation/viasd'")
                if r.info.status == "FINISHED"]

    exp_id = client.get_experiment_by_name("viasd-smoke").experiment_id
    before = len(decodes())
    run([str(BIN / "dvc"), "exp", "run", "--queue", "-S", f"decode.gamma={gamma + 2}", "-n", "queued-gamma"], repo)
    run([str(BIN / "dvc"), "queue", "start"], repo)
    deadline = time.time() + 900
    while True:
        status = run([str(BIN / "dvc"), "queue", "status"], repo).stdout
        if not any(word in status for word in ("Queued", "Running")):
            break
        assert time.time() < deadline, status
        time.sleep(3)
    assert "Success" in status and "queued-gamma" in status, status
    assert len(decodes()) == before + 1
    assert not list((repo / ".dvc" / "tmp" / "exps").rglob("mlflow.db"))
    # `dvc plots diff` between the two experiments draws both: the frontier's points of each, by revision
    diff = json.loads(run([str(BIN / "dvc"), "plots", "diff", "gamma-up", "queued-gamma", "--json"], repo).stdout)
    frontier = [v for item in diff["data"][FRONTIER_PLOT] for v in item["content"]["data"]["values"]]
    assert {v["rev"] for v in frontier} == {"gamma-up", "queued-gamma"}, {v.get("rev") for v in frontier}
    assert all({v["run"] for v in frontier if v["rev"] == rev} == set(DVC_RUNS) for rev in ("gamma-up", "queued-gamma"))

    # fewer test prompts: the task's prompt files are rebuilt, dev.jsonl hashes the same, so no training,
    # no mask search and no threshold search re-run
    params["tasks"]["stdlib_continuation"]["test_prompts"] -= 1
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    third = stages_run(run([str(BIN / "dvc"), "repro"], repo, timeout=1200).stdout)
    assert "prepare_task@stdlib_continuation-test" in third and "report" in third
    assert not {n for n in third if n.split("@")[0] in ("prepare_corpus", "train_model", "train_draft", "dimr_search",
                                                         "train_router", "tune_thresholds")}, third

    pushed = run([str(BIN / "dvc"), "push"], repo)
    assert "pushed" in pushed.stdout and any((repo / ".dvc-remote").rglob("*"))
