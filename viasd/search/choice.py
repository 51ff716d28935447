"""The choice among a threshold search's points (`search.thresholds`): the cheapest feasible SD point, replaced
by a tiered trial that meets the fidelity floor with confidence (`eligible`), saves `ThresholdConfig.min_gain` of
SD's cost, comes first among those in `rank_candidates`' order (cheapest first, but among costs within the cost
model's resolution, `ThresholdConfig.cost_resolution`, the most fidelity margin first) and meets the quality
constraints again on held-out dev prompts, its fidelity there with the same confidence (`confirm_choice`).
Points are `search.thresholds._point` dicts (policy fields and measures); `cfg` is a
`search.thresholds.ThresholdConfig` and `confirm` a `search.dev_set.DevSet`."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from statistics import NormalDist

from ..decoding.policy import TUNED_FIELDS
from ..errors import ViasdError

log = logging.getLogger(__name__)


class InfeasibleError(ViasdError):
    """No candidate, not even the tiers-off (SD) point, met the quality constraints."""


def fidelity_lower_bound(point: dict, confidence: float) -> float | None:
    """The one-sided lower confidence bound of a point's fidelity at `confidence`: f - z * SE, with SE its
    standard error over the prompts it was measured on (`fidelity_standard_error`) and z the normal quantile
    (1.645 at 0.95). A point without a spread (a single prompt, or recorded before it was kept) has SE 0."""
    if point.get("fidelity") is None:
        return None
    return point["fidelity"] - NormalDist().inv_cdf(confidence) * (point.get("fidelity_se") or 0.0)


def eligible(point: dict, cfg) -> bool:
    """Whether a feasible point may be chosen: SD always; a tiered policy only if its fidelity's lower
    confidence bound (`cfg.fidelity_confidence`) meets the floor, not just its point estimate.

    Why: fidelity, like the task drop, is measured on the same few dev prompts for every trial, and the
    search keeps the cheapest trial that met the floor, which sits at the floor because of the prompts it
    drew as much as because of its thresholds (docs/quality.md, "The choice, confirmed on held-out prompts").
    The bound asks the margin that the dev prompts' own spread justifies; the held-out confirmation then checks the pick."""
    if point["tiers_off"] or cfg.quality.min_fidelity is None:
        return True
    bound = fidelity_lower_bound(point, cfg.fidelity_confidence)
    return bound is None or bound >= cfg.quality.min_fidelity


def held_out_bound_violation(bound: float | None, cfg) -> dict:
    """`{"fidelity_lower_bound": shortfall}` when the held-out fidelity's lower confidence bound `bound`
    (`fidelity_lower_bound` at `cfg.fidelity_confidence`, its standard error over the held-out prompts' groups)
    misses the floor, else {}.

    Why: the held-out prompts are the evidence the choice's fidelity rests on, and on them a point estimate just
    over the floor is a coin toss on the next prompts (docs/quality.md). The same confidence as on dev
    (`eligible`), so one setting says how sure the choice must be."""
    floor = cfg.quality.min_fidelity
    if floor is None or bound is None or bound >= floor:
        return {}
    return {"fidelity_lower_bound": floor - bound}


def _round(value: float | None) -> str:
    return "none" if value is None else f"{value:.3f}"


def rank_candidates(tiered: list[dict], cfg) -> list[dict]:
    """`tiered` (eligible feasible tiered points, each with its `fidelity_lower_bound`) in the order the choice
    takes them: those whose cost is within `cfg.cost_resolution` of the cheapest's, the highest fidelity bound
    first, then the rest, cheapest first.

    Why: the cost model's per-pass costs are measured on a few decodes, and costs that close cannot be told
    apart (a fully gated policy, SD with split passes, came out cheaper than SD by that noise alone, which is why
    `min_gain` exists); between policies the model cannot rank, the one with the most fidelity
    margin is the better bet, as the one-standard-error rule takes the simplest model among those whose errors
    cannot be told apart. The bound, not the dev task drop, ranks them: the drop on 24 prompts has a standard
    error about as large as its bar, so ranking by it would pick the luckiest drop again (docs/quality.md,
    "Costs the model cannot tell apart")."""
    if not tiered:
        return []
    tiered = sorted(tiered, key=lambda t: (t["cost_per_token"], t["number"] or 0))
    window = (1 + cfg.cost_resolution) * tiered[0]["cost_per_token"]
    ties = [t for t in tiered if t["cost_per_token"] <= window]
    ties.sort(key=lambda t: (-(t["fidelity_lower_bound"] if t["fidelity_lower_bound"] is not None else -math.inf),
                             t["cost_per_token"], t["number"] or 0))
    return ties + tiered[len(ties):]


def confirm_choice(ranked: list[dict], confirm, cfg) -> tuple[dict | None, list[dict]]:
    """The first of `ranked` (feasible tiered points, cheapest first) that also meets the quality constraints
    on the held-out `confirm` prompts, its fidelity with confidence (`held_out_bound_violation`), trying at most
    `cfg.confirm_candidates`; (None, checks) if none does.

    Why: the search keeps the cheapest of many trials that passed the constraints on the same few dev
    prompts, so it prefers trials whose task-metric drop came out low by chance (a corpus chrF drop on 24
    prompts has a standard error about as large as its bar once most outputs diverge from `ar`'s). The chosen
    policy's figures on dev are biased low; on prompts it was not selected on they are not. Those come from
    other source files than the search's (`split_by_group`): cuts of one file are alike, so held-out cuts of
    the search's own files confirm what the search fitted (docs/quality.md).
    Each check is `{number, search, cost_per_token (dev), fidelity, fidelity_se, fidelity_lower_bound, groups,
    task_drop, task_drop_se, violations, feasible, prompts}`."""
    checks = []
    for point in ranked[: cfg.confirm_candidates]:
        policy = replace(confirm.base, **{k: point[k] for k in TUNED_FIELDS})
        measured = confirm.evaluate(policy, cfg.quality.min_fidelity)
        bound = fidelity_lower_bound(measured, cfg.fidelity_confidence)
        violations = cfg.quality.violations(measured) | held_out_bound_violation(bound, cfg)
        check = {"number": point.get("number"), "search": point.get("search"), "cost_per_token": point["cost_per_token"],
                 **{k: measured[k] for k in ("fidelity", "fidelity_se", "groups", "nll", "task_score", "task_score_ar",
                                             "task_drop", "task_drop_se", "agreement", "prompts", "pruned", "wall_per_token")},
                 "fidelity_lower_bound": bound, "violations": violations, "feasible": not violations}
        checks.append(check)
        log.info("confirming trial #%s on %d held-out dev prompts (%d groups): fidelity %.3f (bound %.3f), task drop %s: %s",
                 point.get("number"), len(confirm.prompts), measured["groups"], measured["fidelity"], bound,
                 measured["task_drop"],
                 "kept" if not violations else f"rejected ({violations})")
        if not violations:
            return point, checks
    return None, checks


def choose(candidates: list[dict], cfg, confirm=None) -> tuple[dict, list[dict]]:
    """The choice among a search's `candidates` (SD points and trials, each a `_point`), and its held-out checks.

    The cheapest feasible SD point, replaced by a feasible tiered trial whose fidelity's lower confidence bound
    meets the floor (`eligible`) if the cheapest such trial saves at least `cfg.min_gain` of SD's cost: the first
    of those that save it in `rank_candidates`' order (among costs the model cannot tell apart, the most fidelity
    margin first) that (with `confirm`) meets the constraints again on the held-out prompts (`confirm_choice`).
    Each candidate gets its `fidelity_lower_bound`. Raises `InfeasibleError` when no candidate is feasible."""
    feasible = [t for t in candidates if t["feasible"]]
    if not feasible:
        closest = min(candidates, key=lambda t: cfg.quality.slack(t))
        raise InfeasibleError(
            f"no thresholds met the quality constraints ({cfg.quality.describe()}), not even tiers off (plain SD): "
            f"over {len(candidates)} candidates the closest missed by {closest['violations']}; relax "
            "thresholds.quality or check the dev split")
    for t in candidates:
        t["fidelity_lower_bound"] = fidelity_lower_bound(t, cfg.fidelity_confidence)
    doubtful = [t for t in feasible if not eligible(t, cfg)]
    if doubtful:
        log.info("%d of %d feasible tiered trials met the fidelity floor on dev but not with %.0f%% confidence: "
                 "not candidates", len(doubtful), sum(not t["tiers_off"] for t in feasible), 100 * cfg.fidelity_confidence)
    feasible = [t for t in feasible if eligible(t, cfg)] or feasible
    # the cheapest feasible SD point, replaced by the cheapest feasible tiered trial only if that saves at
    # least `min_gain` of its cost (otherwise the lossless, slim-free SD point wins)
    best = min(feasible, key=lambda t: (t["cost_per_token"], not t["tiers_off"], t["number"] or 0))
    sd_best = min((t for t in feasible if t["tiers_off"]), key=lambda t: t["cost_per_token"], default=None)
    if sd_best is not None and not best["tiers_off"] and best["cost_per_token"] > (1 - cfg.min_gain) * sd_best["cost_per_token"]:
        log.info("the cheapest tiered trial (#%d) saves %.1f%% of SD's cost, less than min_gain %.1f%%: tiers off",
                 best["number"], 100 * (1 - best["cost_per_token"] / sd_best["cost_per_token"]), 100 * cfg.min_gain)
        best = sd_best
    checks: list[dict] = []
    if not best["tiers_off"]:
        limit = (1 - cfg.min_gain) * sd_best["cost_per_token"] if sd_best is not None else math.inf
        ranked = rank_candidates([t for t in feasible if not t["tiers_off"] and t["cost_per_token"] <= limit], cfg)
        if ranked[0] is not best:
            log.info("trial #%s costs within %.0f%% of the cheapest (#%s), which the cost model cannot tell apart, "
                     "with the higher fidelity bound (%s against %s): first", ranked[0]["number"],
                     100 * cfg.cost_resolution, best["number"], _round(ranked[0]["fidelity_lower_bound"]),
                     _round(best["fidelity_lower_bound"]))
        best = ranked[0]
    if confirm is not None and not best["tiers_off"]:
        kept, checks = confirm_choice(ranked, confirm, cfg)
        if kept is None and sd_best is not None:
            log.info("no tiered policy met %s on the held-out dev prompts: tiers off", cfg.quality.describe())
        best = kept if kept is not None else (sd_best or best)
    return best, checks
