"""Plots of the searches (PNG, matplotlib's Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    tmp.replace(path)


def search_curve(trials: list[dict], path: Path, title: str) -> None:
    """Cost of every trial and the best so far, random phase and Bayesian phase in two colours."""
    plt = _pyplot()
    trials = sorted(trials, key=lambda t: t["number"])
    fig, ax = plt.subplots(figsize=(7, 4))
    best, best_so_far = float("inf"), []
    for t in trials:
        best = min(best, t["cost"])
        best_so_far.append(best)
    x = list(range(1, len(trials) + 1))
    for phase, colour in (("random", "tab:gray"), ("bayes", "tab:blue")):
        pts = [(i, t["cost"]) for i, t in zip(x, trials) if t["phase"] == phase]
        if pts:
            ax.scatter(*zip(*pts), s=14, color=colour, alpha=0.6, label=f"{phase} trials")
    ax.step(x, best_so_far, where="post", color="tab:red", label="best so far")
    n_random = sum(t["phase"] == "random" for t in trials)
    if 0 < n_random < len(trials):
        ax.axvline(n_random + 0.5, color="k", ls=":", lw=1)
    ax.set_xlabel("trial")
    ax.set_ylabel("mask cost (mean KL, nats)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend()
    _save(fig, path)
    plt.close(fig)


def layer_keep_frequency(trials: list[dict], num_layers: int, path: Path, title: str, top: float = 0.2) -> None:
    """How often each layer is kept among the best `top` share of trials."""
    plt = _pyplot()
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
    _save(fig, path)
    plt.close(fig)


def speed_quality(trials: list[dict], best: dict, max_drop: float, path: Path, title: str) -> None:
    """Cost per token vs quality drop of every threshold trial, the constraint and the chosen point."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ok = [t for t in trials if t["quality_drop"] <= max_drop]
    bad = [t for t in trials if t["quality_drop"] > max_drop]
    for group, colour, label in ((ok, "tab:blue", "feasible"), (bad, "tab:gray", "over the quality limit")):
        if group:
            ax.scatter([t["quality_drop"] for t in group], [1000 * t["cost_per_token"] for t in group], s=18,
                       color=colour, alpha=0.7, label=label)
    ax.scatter([best["quality_drop"]], [1000 * best["cost_per_token"]], s=120, marker="*", color="tab:red",
               label=f"chosen (gamma={best['gamma']}, tau_accept={best['tau_accept']:.2f}, "
                     f"tau_slim={best['tau_slim']:.2f})")
    ax.axvline(max_drop, color="k", ls=":", lw=1)
    ax.set_xlabel("quality drop (1 - agreement with target greedy)")
    ax.set_ylabel("modelled cost per token (ms)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    _save(fig, path)
    plt.close(fig)
