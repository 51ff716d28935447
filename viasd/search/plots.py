"""Plots of the searches (PNG, matplotlib's Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

from ..io import pyplot, save_figure


def search_curve(storage: str, study_name: str, n_random: int, path: Path, title: str) -> None:
    """Optuna's optimisation history of the search (every trial's cost and the best so far), on a log
    scale, with the boundary between the random phase and the Bayesian phase marked."""
    import warnings

    import optuna
    from optuna.visualization.matplotlib import plot_optimization_history

    plt = pyplot()
    study = optuna.load_study(study_name=study_name, storage=storage)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        ax = plot_optimization_history(study, target_name="mask cost (mean KL, nats)")
    if 0 < n_random < len(study.trials):
        ax.axvline(n_random - 0.5, color="k", ls=":", lw=1, label="random | Bayesian")
        ax.legend()
    ax.set_yscale("log")
    ax.set_title(title)
    save_figure(ax.figure, path)
    plt.close(ax.figure)


def layer_keep_frequency(trials: list[dict], num_layers: int, path: Path, title: str, top: float = 0.2) -> None:
    """How often each layer is kept among the best `top` share of trials."""
    plt = pyplot()
    ranked = sorted(trials, key=lambda t: t["cost"])
    best = ranked[: max(1, int(len(ranked) * top))]
    freq = [sum(layer in t["keep_layers"] for t in best) / len(best) for layer in range(num_layers)]
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.bar(range(num_layers), freq, color="tab:blue")
    ax.set_xticks(range(num_layers))
    ax.set_xlabel("decoder layer")
    ax.set_ylabel(f"kept in best {int(top * 100)}%")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    save_figure(fig, path)
    plt.close(fig)


def speed_quality(trials: list[dict], best: dict, quality, path: Path, title: str) -> None:
    """Cost per token of every threshold candidate against fidelity (left) and the task-quality drop vs
    ar (right): feasible / infeasible trials, the tiers-off (SD) points, the bounds and the chosen point.
    `quality`: the search's `QualityConstraints`."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panels = ((axes[0], "fidelity", "fidelity (tokens = target's greedy choice given the prefix)",
               quality.min_fidelity),
              (axes[1], "task_drop", f"task-quality drop vs ar ({best.get('task_metric') or 'task metric'}, points)",
               quality.max_task_drop))
    groups = (([t for t in trials if not t.get("tiers_off") and t.get("feasible")], "tab:blue", "o", "feasible"),
              ([t for t in trials if not t.get("tiers_off") and not t.get("feasible")], "tab:gray", "o",
               "misses a quality bound"),
              ([t for t in trials if t.get("tiers_off")], "black", "s", "tiers off (plain SD), per gamma"))
    for ax, key, label, bound in panels:
        for group, colour, marker, name in groups:
            pts = [(t[key], 1000 * t["cost_per_token"]) for t in group if t.get(key) is not None]
            if pts:
                ax.scatter(*zip(*pts), s=18, color=colour, marker=marker, alpha=0.75, label=name)
        if best.get(key) is not None:
            what = ("tiers off (SD)" if best.get("tiers_off") else
                    f"tau_accept={float(best['tau_accept']):.2f}, tau_slim={float(best['tau_slim']):.2f}")
            ax.scatter([best[key]], [1000 * best["cost_per_token"]], s=140, marker="*", color="tab:red",
                       label=f"chosen (gamma={best['gamma']}, {what})")
        if bound is not None:
            ax.axvline(bound, color="k", ls=":", lw=1)
        ax.set_xlabel(label, fontsize=8)
        ax.set_ylabel("modelled cost per token (ms)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path)
    plt.close(fig)


def router_reliability_plot(info: dict, path: Path) -> None:
    """The router's reliability curves on its held-out decodes: mean predicted probability against the
    observed rate per bin, for both heads, with held-out AUC and ECE in the legend."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 4.5))
    ax.plot([0, 1], [0, 1], color="grey", ls=":", lw=1, label="perfect calibration")
    for name, colour in (("draft", "tab:blue"), ("slim", "tab:orange")):
        head = info[name]
        bins = head["reliability"]
        auc = "–" if head["auc"] is None else f"{head['auc']:.3f}"
        ece = "–" if head["ece"] is None else f"{head['ece']:.3f}"
        ax.plot([b["predicted"] for b in bins], [b["observed"] for b in bins], marker="o", color=colour,
                label=f"P({name} right): AUC {auc}, ECE {ece}")
    ax.set_xlabel("predicted probability (held-out decodes)")
    ax.set_ylabel("observed share right")
    ax.set_title(f"router reliability, {info.get('heldout_rows', 0)} held-out rows")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    plt.close(fig)
