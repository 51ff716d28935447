"""The study's comparison as the MLflow experiment's description (markdown), which the MLflow UI shows at the top of
the experiment's page in either of its views (the GenAI overview it opens on, and the training runs): a first line
with the headline (the tuned VIA-SD against SD at its best γ, with its quality), then, one click away, every run of
each pair and task with its speed over `ar` and over SD (95 % intervals), fidelity, task drop and rejection rate, the
speed-against-fidelity plot of each, and links to the saved view of these runs in the runs table
(`study.mlflow_view`)."""

from __future__ import annotations

from ..metrics.speed import describe


def _number(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def headline_line(headline: dict) -> str:
    """One line: the tuned `viasd` against SD at its best γ and over `ar`, with fidelity and task drop, per pair and
    task."""
    parts = []
    for pair, tasks in headline.items():
        for task, runs in tasks.items():
            v = runs.get("viasd")
            if v is None:
                continue
            parts.append(f"{pair}/{task}: viasd {describe(v.get('vs_sd_best'), 2)} vs SD, "
                         f"{describe(v.get('vs_ar'), 2)} vs ar, fidelity {_number(v.get('fidelity'))}, "
                         f"task drop {_number(v.get('task_drop'), 2)}")
    return "; ".join(parts) or "no viasd run in the grid"


def experiment_overview(study: str, headline: dict, plots: dict[tuple[str, str], str] | None = None,
                        runs_link: str | None = None, chart_link: str | None = None) -> str:
    """The description: `headline` is the report's per pair, task and run figures (`metrics.json`); `plots`: a
    (pair, task) -> image URL of its speed-against-fidelity plot; `runs_link` and `chart_link`: the runs table's
    view of the compared runs, as a table and as charts."""
    lines = [f"**{headline_line(headline)}** (study `{study}`, test split; 95 % intervals)", ""]
    for pair, tasks in headline.items():
        for task, runs in tasks.items():
            lines += [f"### {pair} on {task}", "",
                      "| run | γ | vs ar | vs SD (best γ) | fidelity | task drop | rejection rate |",
                      "|---|---|---|---|---|---|---|"]
            for name, r in runs.items():
                gamma = r.get("gamma") if r.get("gamma") is not None and name != "ar" else "–"
                lines.append(f"| {name} | {gamma} | "
                             f"{describe(r.get('vs_ar'))} | {describe(r.get('vs_sd_best'))} | "
                             f"{_number(r.get('fidelity'))} | {_number(r.get('task_drop'), 2)} | "
                             f"{_number(r.get('rejection_rate'))} |")
            if plots and (pair, task) in plots:
                lines += ["", f"![speed against quality]({plots[pair, task]})"]
            lines.append("")
    if runs_link:
        chart = f", or [as charts]({chart_link})" if chart_link else ""
        lines.append(f"These runs in MLflow's runs table, with every parameter and metric: [compare the runs]"
                     f"({runs_link}){chart} (the view `viasd: runs compared` under \"Views\" in the Model training "
                     f"mode).")
    return "\n".join(lines)
