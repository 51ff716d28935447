"""Threshold tuning for VIA-SD (DESIGN.md §2.4) with Optuna, on a task's dev split.

Searched: `gamma`, `tau_accept` (log scale), `tau_slim`, and the tier rule variants (score and
confidence functions). Objective: cost per generated token under the cost model
`(draft passes * c_p + slim passes * c_s + full passes * c_q) / tokens`, with per-pass costs `c`
measured on this machine; the measured wall time per token is recorded beside it. Constraint:
quality drop `1 - agreement with the target's greedy output` at most `max_quality_drop`. The best
trial is the cheapest feasible one; when none is feasible the search fails and says which
constraint was missed and by how much.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from ..errors import ViasdError
from ..metrics.model_metrics import agreement
from ..models import ModelSet
from ..policy import DecodePolicy
from ..stats import DecodeStats
from ..tasks.base import Example


class InfeasibleError(ViasdError):
    """No trial met the quality constraint."""


@dataclass(frozen=True)
class ThresholdConfig:
    n_trials: int = 30
    max_quality_drop: float = 0.1
    gamma: tuple[int, ...] = (2, 3, 4, 6)
    tau_accept: tuple[float, float] = (0.3, 3.0)
    tau_slim: tuple[float, float] = (0.2, 0.95)
    scores: tuple[str, ...] = ("ratio", "ratio_argmax")
    confidences: tuple[str, ...] = ("max_prob", "margin")
    seed: int = 0


class DevSet:
    """Dev prompts with the target's greedy outputs, computed once, and the cost model's per-pass costs.

    `pass_cost` (seconds per pass of `draft`, `slim`, `target`) measured elsewhere is used as given:
    searches for several slim verifiers of the same size then differ by their pass counts, not by
    timing noise. Without it, `measure_pass_cost` times them here (once, on first need)."""

    def __init__(self, models: ModelSet, examples: list[Example], max_new_tokens: int, stop_strings=(),
                 pass_cost: dict[str, float] | None = None):
        self.models = models
        self.prompts = [e.prompt_ids if e.prompt_ids is not None else models.encode(e.prompt) for e in examples]
        self.base = DecodePolicy(method="viasd", max_new_tokens=max_new_tokens, stop_strings=tuple(stop_strings))
        ar = [models.generate(p, replace(self.base, method="ar")) for p in self.prompts]
        self.reference = [r.token_ids for r in ar]
        ar_stats = DecodeStats.merge([r.stats for r in ar])
        self.ar_seconds_per_token = ar_stats.wall_time_s / max(ar_stats.new_tokens, 1)
        self.pass_cost = dict(pass_cost) if pass_cost is not None else None

    def measure_pass_cost(self) -> dict[str, float]:
        """Seconds per pass of each model, from `sd`-like decodes (tiers off) of the first two prompts."""
        probe = DecodeStats.merge([self.models.generate(p, replace(self.base, gamma=4, tau_accept=math.inf,
                                                                  tau_slim=math.inf)).stats for p in self.prompts[:2]])
        self.pass_cost = {m: probe.time_s[m] / max(probe.passes[m], 1) for m in ("draft", "slim", "target")}
        return self.pass_cost

    def evaluate(self, policy: DecodePolicy) -> dict:
        results = [self.models.generate(p, policy) for p in self.prompts]
        stats = DecodeStats.merge([r.stats for r in results])
        tokens = max(stats.new_tokens, 1)
        agree = sum(agreement(r.token_ids, ref) for r, ref in zip(results, self.reference)) / len(results)
        modeled = sum(stats.passes.get(m, 0) * c for m, c in self.pass_cost.items()) / tokens
        return {"cost_per_token": modeled, "wall_per_token": stats.wall_time_s / tokens, "agreement": agree,
                "quality_drop": 1 - agree, "rejection_rate": stats.rejection_rate,
                "acceptance_rate": stats.acceptance_rate, "block_escalation_rate": stats.block_escalation_rate,
                "full_passes_per_token": stats.full_passes_per_token(),
                "passes_per_token": {m: stats.passes.get(m, 0) / tokens for m in self.pass_cost},
                "speedup_model_vs_ar": (self.pass_cost["target"] / modeled) if modeled else None}


def tune_thresholds(dev: DevSet, cfg: ThresholdConfig, storage: str, study_name: str, progress: bool = True) -> dict:
    """Run (or continue) the study; returns the best feasible trial's parameters and measurements."""
    import optuna
    from tqdm.auto import tqdm

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    study = optuna.create_study(storage=storage, study_name=study_name, direction="minimize", load_if_exists=True)
    # the cost model's per-pass costs belong to the study: measured (or shared) when it starts and read back
    # when it resumes, so every trial's objective uses the same costs
    if "pass_cost_s" in study.user_attrs:
        dev.pass_cost = dict(study.user_attrs["pass_cost_s"])
    else:
        study.set_user_attr("pass_cost_s", dev.pass_cost or dev.measure_pass_cost())
    complete = optuna.trial.TrialState.COMPLETE
    done = [t for t in study.trials if t.state == complete]
    bar = tqdm(total=cfg.n_trials, initial=len(done), desc="threshold search", disable=not progress, unit="trial")
    while len(done) < cfg.n_trials:
        study.sampler = optuna.samplers.TPESampler(seed=cfg.seed * 1_000_003 + len(done),
                                                   n_startup_trials=max(4, cfg.n_trials // 4))
        trial = study.ask()
        policy = replace(dev.base,
                         gamma=trial.suggest_categorical("gamma", list(cfg.gamma)),
                         tau_accept=trial.suggest_float("tau_accept", *cfg.tau_accept, log=True),
                         tau_slim=trial.suggest_float("tau_slim", *cfg.tau_slim),
                         score=trial.suggest_categorical("score", list(cfg.scores)),
                         confidence=trial.suggest_categorical("confidence", list(cfg.confidences)))
        start = time.perf_counter()
        measured = dev.evaluate(policy)
        measured["seconds"] = time.perf_counter() - start
        for key, value in measured.items():
            trial.set_user_attr(key, value)
        trial.set_constraint("quality_drop", measured["quality_drop"] - cfg.max_quality_drop)  # <= 0: feasible
        done.append(study.tell(trial, measured["cost_per_token"]))  # without re-reading the storage
        bar.update(1)
    bar.close()
    trials = [{"number": t.number, **t.params, **t.user_attrs} for t in done]
    feasible = [t for t in trials if t["quality_drop"] <= cfg.max_quality_drop]
    if not feasible:
        best_drop = min(t["quality_drop"] for t in trials)
        raise InfeasibleError(
            f"no thresholds met the quality constraint: the smallest quality drop over {len(trials)} trials was "
            f"{best_drop:.3f} > max_quality_drop {cfg.max_quality_drop}; raise thresholds.max_quality_drop, "
            "widen the tau ranges or run more trials")
    best = min(feasible, key=lambda t: (t["cost_per_token"], t["number"]))
    sd = dev.evaluate(replace(dev.base, method="sd", gamma=best["gamma"]))  # the lossless baseline, same gamma
    return {"best": best, "trials": trials, "pass_cost": dev.pass_cost, "sd": sd,
            "ar_seconds_per_token": dev.ar_seconds_per_token}
