"""The study's comparison as a saved view of the MLflow UI's runs table: the evaluated runs of every pair, task and run
of the grid as rows, with their speed over `ar` and over SD at its best γ (95 % intervals), fidelity, task drop and
rejection rate as columns, sorted by speed, and charts of speed against fidelity and of the gain over SD against task
drop.

How the MLflow UI (3.x) keeps views: the runs table's "Views" list, and the link its "Save view" dialog copies, are
experiment tags `mlflow.sharedViewState.<id>` holding `{"name", "createdAt", "updatedAt", "state"}`, `state` being the
page's search facets and table/chart state as JSON; `#/experiments/<id>/runs?viewStateShareKey=<id>` opens one. The
report writes one such view, `viasd-compare`, anew after every report, so the view and its link always show the runs
that report compared.

Which runs: the report tags the evaluate run of each cell it compared (the newest finished one) with
`compared_in=<the report's run id>` and logs on it the figure only the report can compute, the run's speed over SD at
its best γ (`speed.vs_sd_best.{ratio,low,high}`); the view filters on that tag. Nested runs whose parent the filter
leaves out are shown as rows of their own, so the workflow's parent run does not fold them away.
"""

from __future__ import annotations

import json
import time
import uuid

VIEW_ID = "viasd-compare"
VIEW_NAME = "viasd: runs compared"
VIEW_TAG_PREFIX = "mlflow.sharedViewState."
COMPARED_TAG = "compared_in"

SPEED = "speed.vs_ar.ratio"
VS_SD = "speed.vs_sd_best"
FIDELITY = "quality.fidelity"
TASK_DROP = "quality.task_drop"
REJECTION = "rejection_rate"
METRIC_COLUMNS = [SPEED, f"{VS_SD}.ratio", f"{VS_SD}.low", f"{VS_SD}.high", FIDELITY, TASK_DROP, REJECTION]
TAG_COLUMNS = ["pair", "task", "run", "ablation"]


def _column(group: str, key: str) -> str:
    """The runs table's column key (`<group>.` + the name in backquotes), as the UI writes it."""
    return f"{group}.`{key}`"


def _chart(section: str, kind: str, **fields) -> dict:
    return {"uuid": f"viasd-{uuid.uuid5(uuid.NAMESPACE_URL, kind + json.dumps(fields, sort_keys=True)).hex[:12]}",
            "type": kind, "runsCountToCompare": 100, "metricSectionId": section, "deleted": False,
            "isGenerated": False, **fields}


def _scatter(section: str, x: str, y: str) -> dict:
    return _chart(section, "SCATTER", xaxis={"key": x, "type": "METRIC"}, yaxis={"key": y, "type": "METRIC"})


def view_state(report_run_id: str) -> dict:
    """The runs page's state of the view: the search facets (filter, order, time range) and the table and chart
    state the UI saves with a view (the keys of MLflow's `ExperimentPageUIState`)."""
    section = "viasd-compare-charts"
    return {
        "searchFilter": f"tags.{COMPARED_TAG} = '{report_run_id}'",
        "orderByKey": _column("metrics", SPEED), "orderByAsc": False, "startTime": "ALL",
        "lifecycleFilter": "Active", "datasetsFilter": [], "modelVersionFilter": "All Runs",
        "selectedColumns": [_column("tags", t) for t in TAG_COLUMNS] + [_column("metrics", m) for m in METRIC_COLUMNS],
        "columnOrder": [], "columnWidths": {}, "runsHiddenMode": "SHOW_ALL",
        "compareRunCharts": [_scatter(section, FIDELITY, SPEED), _scatter(section, TASK_DROP, f"{VS_SD}.ratio"),
                             _chart(section, "BAR", metricKey=f"{VS_SD}.ratio")],
        "compareRunSections": [{"uuid": section, "name": "speed against quality", "display": True,
                                "isReordered": False, "deleted": False, "isGenerated": False}],
        "viewMaximized": False, "runListHidden": False, "isAccordionReordered": False,
        "useGroupedValuesInCharts": True, "hideEmptyCharts": True, "groupBy": None, "groupsExpanded": {},
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }


def view_envelope(state: dict, now_ms: int | None = None) -> str:
    """The experiment tag's value: the view's name, times (ms) and its state as a JSON string."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return json.dumps({"name": VIEW_NAME, "createdAt": now_ms, "updatedAt": now_ms, "state": json.dumps(state)})


def view_link(experiment_id: str, chart: bool = False) -> str:
    """The view's address in the UI (relative to its root); `chart`: its chart mode."""
    mode = "&compareRunsMode=CHART" if chart else ""
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={VIEW_ID}&workflowType=machine_learning{mode}"


def mark_compared_runs(client, experiment_id: str, report_run_id: str, headline: dict) -> int:
    """Tag the newest finished evaluate run of every cell of `headline` (pair -> task -> run -> figures, the
    report's `metrics.json`) as compared in `report_run_id` and log its speed over SD at its best γ; returns how
    many runs it marked."""
    from mlflow.entities import Metric

    newest = {}  # (pair, task, run) -> the newest finished evaluate run (one search over the store)
    for r in client.search_runs([experiment_id], "tags.stage = 'evaluate' and attributes.status = 'FINISHED'",
                                max_results=50000, order_by=["attributes.start_time DESC"]):
        newest.setdefault((r.data.tags.get("pair"), r.data.tags.get("task"), r.data.tags.get("run")), r.info.run_id)
    marked = 0
    for pair, tasks in headline.items():
        for task, runs in tasks.items():
            for name, figures in runs.items():
                run_id = newest.get((pair, task, name))
                if run_id is None:
                    continue
                now = int(time.time() * 1000)
                vs_sd = figures.get("vs_sd_best") or {}
                client.log_batch(run_id, metrics=[Metric(f"{VS_SD}.{k}", float(vs_sd[k]), now, 0)
                                                  for k in ("ratio", "low", "high") if vs_sd.get(k) is not None])
                client.set_tag(run_id, COMPARED_TAG, report_run_id)
                marked += 1
    return marked


def save_compare_view(client, experiment_id: str, report_run_id: str, headline: dict) -> int:
    """Mark the compared runs and (re)write the saved view `viasd-compare` that lists them; returns how many runs
    the view shows."""
    marked = mark_compared_runs(client, experiment_id, report_run_id, headline)
    client.set_experiment_tag(experiment_id, VIEW_TAG_PREFIX + VIEW_ID, view_envelope(view_state(report_run_id)))
    return marked


def compare_view_page(root, experiment: str, server: str = "http://127.0.0.1:5000") -> str | None:
    """The saved view's page on an `mlflow ui` at `server`, once a report has written it (else None)."""
    from .tracking import experiment_client

    client, exp_id = experiment_client(root, experiment)
    if VIEW_TAG_PREFIX + VIEW_ID not in client.get_experiment(exp_id).tags:
        return None
    return f"{server}/{view_link(exp_id)}"


def publish_comparison(root, experiment: str, study: str, headline: dict, report_run_id: str) -> int:
    """What the report leaves in the MLflow UI: the saved view of the compared runs and the experiment's description
    (`report.overview`: the headline, every run's figures, each task's frontier plot from the report's run, links to
    the view as a table and as charts); returns how many runs the view shows."""
    from ..report.overview import experiment_overview
    from .tracking import artifact_url, describe_experiment, experiment_client

    client, exp_id = experiment_client(root, experiment)
    shown = save_compare_view(client, exp_id, report_run_id, headline)
    plots = {(p, t): artifact_url(report_run_id, f"{p}-{t}-frontier.png") for p, tasks in headline.items()
             for t in tasks}
    describe_experiment(root, experiment, experiment_overview(study, headline, plots, view_link(exp_id),
                                                              view_link(exp_id, chart=True)))
    return shown
