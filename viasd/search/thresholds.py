"""Threshold tuning for VIA-SD (docs/method.md, "Threshold tuning") with Optuna, on a task's dev split.

Searched: `gamma`, the score (tier 1) with a `tau_accept` range that suits it (a likelihood ratio on a
log scale, a probability on [0, 1]), the confidence (tier 2) and `tau_slim`, the draft gate (tier 0),
`max_lag` and `verify_lagged`. Objective: cost per generated token under the cost model, the sum over
the decoding passes of `c_layout(width)` per token (`search.pass_cost`: draft, slim and full passes,
with reuse the shared trunk and the two rests, each priced by the tokens it feeds), the costs fitted
on probe decodes at every searched gamma on this machine; the measured wall time per token is recorded
beside it. Constraints
(`metrics.quality.QualityConstraints`): fidelity, the task metric's drop against `ar` on the same
prompts, optionally agreement.

The tiers-off point (`viasd` with every tier off decodes exactly as `sd`, no slim pass) is always a
candidate, at every searched `gamma`: a tuned policy is never costlier than SD on the dev split, and
when SD wins the result says so (`tiers_off`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, replace

from ..decoding.policy import TUNED_FIELDS, DecodePolicy
from ..metrics.quality import QualityConstraints
from .choice import choose
from .dev_set import OFF, DevSet
from .pass_cost import (
    PassCost,
    cost_per_token,
    costs_from_json,
    costs_to_json,
    split_key,
)
from .wall_factors import calibrated, wall_factors
from .workers import SERIAL, Worker, run_trials

log = logging.getLogger(__name__)

# scores whose values are probabilities (tau_accept searched on [0, 1]); the others are ratios (log scale)
PROBABILITY_SCORES = frozenset({"slim_prob"})



@dataclass(frozen=True)
class ThresholdConfig:
    n_trials: int = 30
    quality: QualityConstraints = field(default_factory=QualityConstraints)
    gamma: tuple[int, ...] = (2, 3, 4, 6)
    tau_accept: tuple[float, float] = (0.3, 3.0)  # ratio scores, log scale
    tau_accept_prob: tuple[float, float] = (0.05, 1.0)  # probability scores
    tau_slim: tuple[float, float] = (0.2, 0.99)
    scores: tuple[str, ...] = ("ratio", "ratio_argmax", "slim_prob")
    confidences: tuple[str, ...] = ("max_prob", "margin")
    gate: tuple[float, float] = (0.0, 0.9)  # draft-confidence gate; 0 = off
    # dynamic draft length: a block's drafting stops after a token the drafter gave p below it; the lower bound
    # is off (a fixed gamma), and a range with its upper bound above the lower is searched as the gate is
    draft_stop: tuple[float, float] = (0.0, 0.0)
    max_lag: tuple[int, ...] = (0, 16)
    verify_lagged: tuple[bool, ...] = (True, False)
    verify_block: tuple[bool, ...] = (False,)
    # who decides the tiers: the hand-set rules (score / confidence above), or the learned router with its
    # two probability thresholds searched on `tau_router` (only where the search's models carry a router)
    routers: tuple[str, ...] = ("rules",)
    tau_router: tuple[float, float] = (0.3, 0.99)
    # the learned router's search starts, at every gamma, with both thresholds at each of these probabilities
    # (`router_start_points`), then samples: the calibrated heads put the useful policies near that diagonal, and
    # a start that does not depend on the trials' costs keeps the searched frontier from depending on the day
    router_start: tuple[float, ...] = ()
    # a tiered policy replaces SD only if the cost model says it saves at least this share of SD's cost:
    # below it the saving is within the resolution of the measured per-pass costs (a fully gated policy,
    # i.e. SD with split passes, can look a few percent cheaper or dearer by measurement noise alone)
    min_gain: float = 0.03
    # tiered candidates whose costs are within this share of the cheapest's are ties (the same resolution as
    # `min_gain`): among them the choice takes the highest fidelity lower bound first (`choice.rank_candidates`)
    cost_resolution: float = 0.03
    # the chosen tiered policy is decoded again on held-out dev prompts (`tune_thresholds`'s `confirm`) and kept
    # only if it meets the constraints there too, its held-out fidelity's lower bound at `fidelity_confidence`
    # included (`choice.held_out_bound_violation`); else the next cheapest, up to this many; else SD
    confirm_candidates: int = 4
    # a tiered trial is a candidate for the choice only if the one-sided lower confidence bound of its dev
    # fidelity at this level (its standard error over the dev prompts) meets the fidelity floor: the cheapest
    # of many trials that met the floor on the same prompts met it partly by chance (`fidelity_lower_bound`); the
    # held-out check asks the same of the held-out fidelity; 0.5 = the point estimate
    fidelity_confidence: float = 0.95
    seed: int = 0


# the search-space fields only one kind of router draws from (`suggest_policy`)
ROUTER_FIELDS = {"rules": ("tau_accept", "tau_accept_prob", "tau_slim", "scores", "confidences"),
                 "learned": ("tau_router", "router_start")}


# the fields that only select among a search's trials (`choice.choose`): a change re-selects from the same,
# resumed Optuna study
CHOICE_FIELDS = ("min_gain", "cost_resolution", "confirm_candidates", "fidelity_confidence")


def searched_space(cfg: ThresholdConfig) -> dict:
    """`cfg` as a dict, without the fields of the routers this search does not draw (`ROUTER_FIELDS`): what a
    search's result depends on, so a change to the learned router's `tau_router` leaves the hand rules' and the
    slim ablations' searches (`routers: [rules]`) up to date, and their Optuna studies resumable; a closed
    `draft_stop` range (not searched) is left out too. The Optuna study's own name also leaves out `CHOICE_FIELDS`."""
    unused = {f for router, fields in ROUTER_FIELDS.items() if router not in cfg.routers for f in fields}
    if cfg.draft_stop[1] <= cfg.draft_stop[0]:  # not searched: the same search as one before the field existed
        unused.add("draft_stop")
    return {k: v for k, v in asdict(cfg).items() if k not in unused}


def suggest_policy(trial, base: DecodePolicy, cfg: ThresholdConfig) -> DecodePolicy:
    """One point of the search space; `tau_accept` is searched per kind of score (its own parameter), and
    with the learned router both thresholds are probabilities (`tau_router_accept`, `tau_router_slim`)."""
    router = trial.suggest_categorical("router", list(cfg.routers)) if len(cfg.routers) > 1 else cfg.routers[0]
    if router == "learned":
        tiers = dict(router=router, tau_accept=trial.suggest_float("tau_router_accept", *cfg.tau_router),
                     tau_slim=trial.suggest_float("tau_router_slim", *cfg.tau_router))
    else:
        score = trial.suggest_categorical("score", list(cfg.scores))
        if score in PROBABILITY_SCORES:
            tau_accept = trial.suggest_float("tau_accept_prob", *cfg.tau_accept_prob)
        else:
            tau_accept = trial.suggest_float("tau_accept_ratio", *cfg.tau_accept, log=True)
        tiers = dict(router=router, score=score, tau_accept=tau_accept,
                     confidence=trial.suggest_categorical("confidence", list(cfg.confidences)),
                     tau_slim=trial.suggest_float("tau_slim", *cfg.tau_slim))
    return replace(base, **tiers,
                   gamma=trial.suggest_categorical("gamma", list(cfg.gamma)),
                   gate=_suggest_gate(trial, cfg),
                   draft_stop=_suggest_switched(trial, "draft_stop", cfg.draft_stop),
                   max_lag=trial.suggest_categorical("max_lag", list(cfg.max_lag)),
                   verify_lagged=trial.suggest_categorical("verify_lagged", list(cfg.verify_lagged)),
                   verify_block=trial.suggest_categorical("verify_block", list(cfg.verify_block)))


def _suggest_gate(trial, cfg: ThresholdConfig) -> float:
    """The draft gate: first whether it is on at all (off is the lower bound, usually 0: a value the
    continuous range alone would almost never draw), then its threshold."""
    return _suggest_switched(trial, "gate", cfg.gate)


def _suggest_switched(trial, name: str, bounds: tuple[float, float]) -> float:
    """A threshold whose lower bound is "off": whether it is on (`<name>_on`), then its value; the lower bound
    without a parameter where the range is empty (not searched)."""
    if bounds[1] <= bounds[0] or not trial.suggest_categorical(f"{name}_on", [False, True]):
        return bounds[0]
    return trial.suggest_float(name, *bounds)


POLICY_KEYS = TUNED_FIELDS
POLICY_DEFAULTS = {k: getattr(DecodePolicy(), k) for k in POLICY_KEYS}


def _point(policy: DecodePolicy, measured: dict, cfg: ThresholdConfig, **extra) -> dict:
    point = {k: getattr(policy, k) for k in POLICY_KEYS}
    point.update(extra, **measured)
    point["violations"] = cfg.quality.violations(measured)
    point["feasible"] = not point["violations"]
    return point


def tiers_off_points(dev: DevSet, cfg: ThresholdConfig, study) -> list[dict]:
    """The SD point at every searched gamma (viasd with every tier off), measured once per study."""
    if "tiers_off_points" in study.user_attrs:
        return [{**p, "tau_accept": OFF, "tau_slim": OFF} for p in study.user_attrs["tiers_off_points"]]
    shared = dev.shared
    if shared.tiers_off is not None and all(split_key(k)[0] in dev.pass_cost
                                            for p in shared.tiers_off for k in p["pass_widths_per_token"]):
        # the same SD decodes (no slim runs in them), costed with this search's per-pass costs
        points = [_recosted(p, dev) for p in shared.tiers_off]
        points = [{**p, "violations": cfg.quality.violations(p)} for p in points]
        points = [{**p, "feasible": not p["violations"]} for p in points]
        study.set_user_attr("tiers_off_points", [{**p, "tau_accept": "inf", "tau_slim": "inf"} for p in points])
        return points
    points = []
    for gamma in cfg.gamma:
        policy = replace(dev.base, gamma=gamma, tau_accept=OFF, tau_slim=OFF, gate=0.0, max_lag=0)
        start = time.perf_counter()
        measured = dev.evaluate(policy)
        measured["seconds"] = time.perf_counter() - start
        points.append(_point(policy, measured, cfg, number=None, tiers_off=True))
    study.set_user_attr("tiers_off_points", [{**p, "tau_accept": "inf", "tau_slim": "inf"} for p in points])
    shared.tiers_off = points
    return points


def oracle_points(dev: DevSet, cfg: ThresholdConfig) -> list[dict]:
    """The oracle router at every searched gamma on the dev split: the ceiling any router could reach under
    this cost model (fidelity 1; its peek passes are not priced)."""
    from ..decoding.tier_router import oracle_settings

    points = []
    for gamma in cfg.gamma:
        policy = replace(dev.base, **oracle_settings(gamma))
        points.append(_point(policy, dev.evaluate(policy), cfg, number=None, tiers_off=False, oracle=True))
    return points


def self_sd_points(dev: DevSet, cfg: ThresholdConfig) -> list[dict]:
    """Self-speculation (`self_sd`: the slim drafts, the full model verifies) at every searched gamma on the dev
    split, so that a `self_sd` run of the study decodes at its own fastest gamma, as SD does. Lossless: each
    point has fidelity 1 in greedy decoding. Its points carry measured wall times only: the cost model's probes
    decode SD and VIA-SD, whose decode loops are priced, not self-speculation's, so these points are ranked by
    their prefill-free wall time per token (`decode_wall_per_token`)."""
    points = []
    for gamma in cfg.gamma:
        policy = replace(dev.base, method="self_sd", gamma=gamma)
        points.append(_point(policy, dev.evaluate(policy, modelled=False), cfg, number=None, tiers_off=False,
                             baseline="self_sd"))
    return points


def drafter_sd_points(dev: DevSet, cfg: ThresholdConfig, drafter: str) -> list[dict]:
    """SD with another drafter than the draft model (`feature`: the feature drafter; `self`: the target's first
    layers; the dev set's models carry it) at every searched gamma on the dev split, so that a `sd-drafter_<name>`
    run decodes at its own fastest gamma, as SD does with its draft model. Lossless; ranked by measured wall time
    per token without the prefill, as `self_sd_points`."""
    points = []
    for gamma in cfg.gamma:
        policy = replace(dev.base, method="sd", gamma=gamma, drafter=drafter)
        points.append(_point(policy, dev.evaluate(policy, modelled=False), cfg, number=None, tiers_off=False,
                             baseline=f"sd-drafter_{drafter}"))
    return points


CASCADE_SLIM_MULTIPLES = (1, 2, 3)  # cascade_sd's searched gamma_slim: these multiples of its gamma


def cascade_sd_points(dev: DevSet, cfg: ThresholdConfig, gamma: int) -> list[dict]:
    """`cascade_sd` at `gamma` (SD's best on these prompts: its inner hop is the draft's SD against the slim) with
    `gamma_slim` = each of `CASCADE_SLIM_MULTIPLES` times gamma (slim-level tokens per full verification: one
    inner round, two, three) on the dev split, so that a `cascade_sd` run decodes at its own fastest setting.
    Lossless (fidelity 1 in greedy decoding); ranked by measured wall time per token without the prefill
    (`decode_wall_per_token`), as `self_sd_points`: the cost model has not priced cascade_sd's two-level loop."""
    points = []
    for k in CASCADE_SLIM_MULTIPLES:
        policy = replace(dev.base, method="cascade_sd", gamma=gamma, gamma_slim=k * gamma)
        points.append(_point(policy, dev.evaluate(policy, modelled=False), cfg, number=None, tiers_off=False,
                             baseline="cascade_sd", gamma_slim=k * gamma))
    return points


def budgeted_oracle_point(dev: DevSet, cfg: ThresholdConfig, gamma: int) -> dict | None:
    """The budgeted oracle at the fidelity floor (`oracle_budget` = 1 - `quality.min_fidelity`) at `gamma` on
    the dev split: the ceiling of a router that spends the same fidelity the tuned policy may spend (the plain
    oracle keeps fidelity 1). It peeks at every block once it has settled a wrong token (its output has left
    the target's greedy one), so it runs at one gamma only, the cheapest plain oracle's. None without a floor."""
    from ..decoding.tier_router import floor_budget, oracle_settings

    budget = floor_budget(cfg.quality.min_fidelity)
    if budget is None:
        return None
    policy = replace(dev.base, **oracle_settings(gamma, budget))
    return _point(policy, dev.evaluate(policy), cfg, number=None, tiers_off=False, oracle=True, oracle_budget=budget)


def _recosted(point: dict, dev: DevSet) -> dict:
    """A measured point's cost under `dev`'s per-pass costs (its passes are the same), and that of the prompts its
    wall time was measured on."""
    cost = cost_per_token(point["pass_widths_per_token"], dev.pass_cost)
    timed = point.get("timed_pass_widths_per_token")
    return {**point, "cost_per_token": cost, "speedup_model_vs_ar": dev.full_pass_cost() / cost if cost else None,
            **({"timed_cost_per_token": cost_per_token(timed, dev.pass_cost)} if timed else {})}


def search_params(point: dict, cfg: ThresholdConfig) -> dict:
    """The Optuna parameters (`suggest_policy`'s names) of a policy `point` (a trial of another search, or a start
    point)."""
    router = point.get("router", "rules")
    out = {"gamma": point["gamma"], "max_lag": point["max_lag"], "verify_lagged": point["verify_lagged"],
           "verify_block": point.get("verify_block", False)}
    if len(cfg.routers) > 1:
        out["router"] = router
    if router == "learned":
        out.update(tau_router_accept=point["tau_accept"], tau_router_slim=point["tau_slim"])
    else:
        score = point["score"]
        out.update({"score": score, "confidence": point["confidence"], "tau_slim": point["tau_slim"],
                    ("tau_accept_prob" if score in PROBABILITY_SCORES else "tau_accept_ratio"): point["tau_accept"]})
    for name in ("gate", "draft_stop"):
        bounds = getattr(cfg, name)
        if bounds[1] > bounds[0]:
            out[f"{name}_on"] = point.get(name, bounds[0]) > bounds[0]
            if out[f"{name}_on"]:
                out[name] = point[name]
    return out


def router_start_points(cfg: ThresholdConfig) -> list[dict]:
    """The learned router's start, as policy points (`search_params` gives their Optuna parameters): for each
    probability of `cfg.router_start` (in order) and each gamma, `tau_accept = tau_slim` at it, the draft gate
    and the dynamic draft length at their lower bounds (off), no forced catch-up (the space's first `max_lag`),
    the lagged tokens unchecked where the space allows (else its first value), the block re-verification its
    first value. Empty without the learned router among `cfg.routers`."""
    if "learned" not in cfg.routers:
        return []
    fixed = {"router": "learned", "gate": cfg.gate[0], "draft_stop": cfg.draft_stop[0], "max_lag": cfg.max_lag[0],
             "verify_block": cfg.verify_block[0],
             "verify_lagged": False if False in cfg.verify_lagged else cfg.verify_lagged[0]}
    return [{**fixed, "gamma": gamma, "tau_accept": tau, "tau_slim": tau}
            for tau in cfg.router_start for gamma in cfg.gamma]


def study_pass_cost(study, dev: DevSet, cfg: ThresholdConfig) -> dict[str, PassCost]:
    """The cost model's per-pass costs of the study: measured (or shared) when it starts and read back when
    it resumes, so that every trial's objective uses the same costs. Workers starting a study together
    may each measure; the first stored set is the study's (read again after measuring)."""
    stored = costs_from_json(study.user_attrs.get("pass_cost_model"))
    if stored is not None:
        return stored
    measured = dev.pass_cost or dev.measure_pass_cost(cfg.gamma)
    stored = costs_from_json(study.user_attrs.get("pass_cost_model"))  # another worker's, stored meanwhile
    if stored is not None:
        return stored
    study.set_user_attr("pass_cost_model", costs_to_json(measured))
    return measured


def tune_thresholds(dev: DevSet, cfg: ThresholdConfig, storage, study_name: str, progress: bool = True,
                    warm_start: list[dict] = (), candidates: list[dict] = (), confirm: DevSet | None = None,
                    worker: Worker = SERIAL) -> dict | None:
    """Run (or continue) the study; returns the best feasible candidate (trials and tiers-off points).

    `warm_start`: policy points (e.g. the best trials of the DIMR slim's search) evaluated first when the
    study is new, so that a shorter search of another slim starts from what worked; then the learned router's
    start (`router_start_points`), then the sampler's own. `confirm`: held-out dev
    prompts on which the chosen tiered policy must meet the constraints again (`confirm_choice`); the
    result's `confirm` lists the checks (empty when SD wins on dev). `worker`: one of several processes
    sharing the study (`search.workers.run_trials`), or a part running the search alone (`Worker.part`): it runs
    trials until the storage holds the budget and returns None; the serial run (the default) then makes the
    choice."""
    import optuna
    from tqdm.auto import tqdm

    optuna.logging.set_verbosity(optuna.logging.WARNING)

    study = optuna.create_study(storage=storage, study_name=study_name, direction="minimize", load_if_exists=True)
    dev.pass_cost = study_pass_cost(study, dev, cfg)
    sd_points = None if worker.partial else tiers_off_points(dev, cfg, study)
    if not study.trials and worker.lead:
        for point in [*warm_start, *router_start_points(cfg)][: cfg.n_trials]:
            study.enqueue_trial(search_params(point, cfg), skip_if_exists=True)
    done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.get_trials(deepcopy=False))
    bar = tqdm(total=cfg.n_trials, initial=min(done, cfg.n_trials), disable=not progress, unit="trial",
               desc=f"threshold search ({worker})" if worker.partial else "threshold search")

    def evaluate(trial) -> float:
        policy = suggest_policy(trial, dev.base, cfg)
        start = time.perf_counter()
        # a trial that can no longer reach the fidelity floor stops early (an exact bound: DevSet.evaluate)
        measured = dev.evaluate(policy, cfg.quality.min_fidelity)
        measured["seconds"] = time.perf_counter() - start
        for key, value in _point(policy, measured, cfg).items():
            trial.set_user_attr(key, value)
        trial.set_constraint("quality", cfg.quality.slack(measured))  # <= 0: feasible (TPE samples around it)
        return measured["cost_per_token"]

    sampler = lambda n: optuna.samplers.TPESampler(seed=worker.seed(cfg.seed * 1_000_003, n),  # noqa: E731
                                                   n_startup_trials=max(4, cfg.n_trials // 4))
    done = run_trials(study, storage, cfg.n_trials, sampler, evaluate, worker, lambda _: bar.update(1))
    bar.close()
    if worker.partial:
        return None
    # every trial costed with the study's per-pass costs (workers that measured their own at the same moment
    # costed their trials with those; the choice uses one cost model)
    trials = [_recosted({"number": t.number, "tiers_off": False, **t.user_attrs}, dev) for t in done]
    for t in trials:
        t.pop("pass_cost_model", None)
        t.pop("surplus", None)
    # `candidates`: trials of another search on the same dev prompts and per-pass costs (e.g. the hand rules'
    # own search), which compete in the choice below
    # a point stored before a tuned field existed (e.g. `draft_stop`) ran at that field's default
    candidates = [{**POLICY_DEFAULTS, **p} for p in (*sd_points, *trials, *candidates)]
    # the model calibrated per gamma on these decodes' wall time (`search.wall_calibration`): what the choice ranks
    factors = wall_factors(candidates)
    log.info("cost model calibrated on the dev decodes' wall time: factor per gamma %s",
             {g: round(f, 3) for g, f in factors.items()})
    candidates = [calibrated(p, factors) for p in candidates]
    sd_points = candidates[: len(sd_points)]
    if confirm is not None:
        confirm.pass_cost = dev.pass_cost
    best, checks = choose(candidates, cfg, confirm)
    sd = next(p for p in sd_points if p["gamma"] == best["gamma"]) if best["gamma"] in cfg.gamma else None
    return {"best": best, "trials": candidates, "pass_cost": dev.pass_cost, "sd": sd, "wall_factors": factors,
            "ar_seconds_per_token": dev.ar_seconds_per_token, "confirm": checks}
