"""The cost model calibrated on the dev decodes' wall time, per block length γ (docs/method.md, "Threshold tuning").

The per-pass model (`search.pass_cost`) prices every decoding pass by its layout and width, fitted on the passes of
a few probe decodes. It leaves out whatever a pass costs because of the passes around it (a likely part on a CPU: a
model's weights evicted from the caches by the pass before, which a short block, switching models more often per
token, pays more often). That error depends on γ, tiered or not, so a search ranking γ 2 against γ 4 on the model
alone picks the short blocks the clock does not reward; in the study, where two searches run side by side, the other
search's phase moves the factors too.

The calibration is one factor per γ: the dev decodes' wall time, prefill left out as in the model, over their
modelled cost, pooled over every decode of the search at that γ (SD's points and every trial, weighted by prompts
decoded), so each factor averages many decodes' timing noise. A point's calibrated cost is its modelled cost times
its γ's factor: what the choice ranks (`choice.choose`) and what the thresholds file reports. The search's sampler
still minimises the model (the factors exist only once the trials have run). Where several machines share a search
(workers), their walls pool into one factor: the model's costs are one machine's too.
"""

from __future__ import annotations

MODEL_KEY = "cost_model_per_token"  # a calibrated point keeps its uncalibrated model cost here


def model_cost(point: dict) -> float:
    """A point's uncalibrated model cost per token: `cost_model_per_token` once it was calibrated (the competing
    search's trials come calibrated with that search's factors), else `cost_per_token`."""
    return point.get(MODEL_KEY, point["cost_per_token"])


def wall_factors(points: list[dict]) -> dict[int, float]:
    """Per γ, `sum(prompts * decode_wall_per_token) / sum(prompts * model cost)` over `points` (`DevSet.evaluate`
    measures: every one carries its prefill-free wall time, the prompts it was measured on, `timed_prompts`, and their
    modelled cost, `timed_cost_per_token`: all it decoded unless the search decodes in batches)."""
    sums: dict[int, list[float]] = {}
    for p in points:
        # a batched search measures walls on its first prompts only (`timed_prompts`), and models their cost apart
        weight = p.get("timed_prompts", p["prompts"])
        timed_model = p.get("timed_cost_per_token")
        entry = sums.setdefault(int(p["gamma"]), [0.0, 0.0])
        entry[0] += weight * p["decode_wall_per_token"]
        entry[1] += weight * (timed_model if timed_model is not None else model_cost(p))
    return {g: w / m for g, (w, m) in sorted(sums.items())}


def calibrated(point: dict, factors: dict[int, float]) -> dict:
    """`point` with `cost_per_token` its model cost times its γ's factor, the model cost kept as
    `cost_model_per_token` (the factor itself is the search's `wall_factors[γ]`)."""
    model = model_cost(point)
    return {**point, MODEL_KEY: model, "cost_per_token": model * factors[int(point["gamma"])]}
