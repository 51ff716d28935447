"""Helpers of the search tests: a real kill-and-resume (run `viasd` in a subprocess, SIGKILL it once its Optuna
storage holds some finished trials, and read the storage's trials), and the threshold search's choice re-derived
from its trace (`check_the_choice`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from statistics import NormalDist

import optuna
import pytest

from viasd.search.thresholds import POLICY_KEYS


def complete_trials(storage, prefix):
    """Finished trials of the one study named `<prefix>-<parameter hash>` in the storage."""
    try:
        names = [n for n in optuna.get_all_study_names(storage) if n.startswith(prefix + "-")]
    except Exception:  # no storage yet
        return []
    assert len(names) <= 1, names
    if not names:
        return []
    study = optuna.load_study(study_name=names[0], storage=storage)
    return [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]


def count_complete_readonly(path) -> int:
    """Finished trials, read without touching the schema the running search may be creating."""
    import sqlite3

    if not path.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1) as db:
            return db.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
    except sqlite3.OperationalError:  # tables not created yet, or locked for a moment
        return 0


def kill_after_trials(args, storage_path, trials: int) -> None:
    """Run `viasd ARGS` in a subprocess and SIGKILL it once `trials` trials are stored."""
    proc = subprocess.Popen([sys.executable, "-m", "viasd.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    while proc.poll() is None and time.time() < deadline:
        if count_complete_readonly(storage_path) >= trials:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the search finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def check_the_calibration(result: dict, trace: list[dict]) -> None:
    """Every point's cost is its model cost times its gamma's wall factor, and each factor is the wall time of the
    search's dev decodes at that gamma (prefill left out) over their model cost, pooled weighted by prompts decoded
    over every point of the trace: SD's, the search's trials and the other search's that compete."""
    sums = {}
    for t in trace:
        assert t["decode_wall_per_token"] <= t["wall_per_token"]  # the prefill left out
        entry = sums.setdefault(str(t["gamma"]), [0.0, 0.0])
        entry[0] += t["prompts"] * t["decode_wall_per_token"]
        entry[1] += t["prompts"] * t["cost_model_per_token"]
    assert result["wall_factors"] == pytest.approx({g: w / m for g, (w, m) in sums.items()})
    for t in [*trace, result["dev"] | {"gamma": result["gamma"]}]:
        assert t["cost_per_token"] == pytest.approx(t["cost_model_per_token"] * result["wall_factors"][str(t["gamma"])])


def check_the_choice(result: dict, trace: list[dict]) -> None:
    """The result is what the selection rule picks from its trace. A tiered trial is a candidate only if its dev
    fidelity's lower confidence bound (recorded in the trace) meets the floor and it saves `min_gain` of the
    cheapest feasible SD point's cost; the candidates are checked on the held-out prompts in this order: those
    costing within `cost_resolution` of the cheapest, highest bound first, then the rest, cheapest first; the
    result is the first that passed, every one before it checked and rejected; or the SD point when none
    passed (or none was a candidate)."""
    check_the_calibration(result, trace)
    config = result["signature"]["config"]
    floor = config["quality"]["min_fidelity"]
    z = NormalDist().inv_cdf(config["fidelity_confidence"])
    for t in trace:
        if t["fidelity"] is not None:
            assert t["fidelity_lower_bound"] == pytest.approx(t["fidelity"] - z * (t["fidelity_se"] or 0.0))
    feasible = [t for t in trace if t["feasible"] and (t["tiers_off"] or t["fidelity_lower_bound"] >= floor)]
    sd_best = min((t for t in feasible if t["tiers_off"]), key=lambda t: t["cost_per_token"])
    limit = (1 - config["min_gain"]) * sd_best["cost_per_token"]
    tiered = sorted((t for t in feasible if not t["tiers_off"] and t["cost_per_token"] <= limit),
                    key=lambda t: (t["cost_per_token"], t["number"]))
    ties = [t for t in tiered if tiered and t["cost_per_token"] <= (1 + config["cost_resolution"]) * tiered[0]["cost_per_token"]]
    order = sorted(ties, key=lambda t: (-t["fidelity_lower_bound"], t["cost_per_token"], t["number"])) + tiered[len(ties):]
    checks = result["confirm"]["checks"]
    for t in [*trace, *checks]:  # the drop's standard error beside every task drop (None: fewer than two files)
        assert "task_drop_se" in t and (t["task_drop_se"] is None or t["task_drop_se"] >= 0)
    assert [(c["number"], c["search"]) for c in checks] == [(t["number"], t.get("search")) for t in order[: len(checks)]]
    if result["tiers_off"]:
        assert result["gamma"] == sd_best["gamma"]
        assert result["dev"]["cost_per_token"] == pytest.approx(sd_best["cost_per_token"])
        assert all(not c["feasible"] for c in checks)
        return
    if checks:  # confirmed on held-out prompts: the first that passed
        assert checks[-1]["feasible"] and not any(c["feasible"] for c in checks[:-1])
    chosen = order[max(len(checks), 1) - 1]
    assert {k: result[k] for k in POLICY_KEYS} == {k: chosen[k] for k in POLICY_KEYS}
    assert result["dev"]["cost_per_token"] == pytest.approx(chosen["cost_per_token"])
