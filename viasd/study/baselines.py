"""The lossless baselines' own best settings on dev: which ones the DIMR slim's threshold search measures (the
grid's runs decide), what they add to its signature, and the measuring itself.

`sd` takes SD's cheapest gamma from the search's tiers-off points (`sd_best`); the others are decoded on the same
dev prompts at each candidate setting and ranked by measured wall time per token without the prefill (the cost
model has not priced their loops): `self_sd_best` (self-speculation's gamma), `cascade_sd_best` (cascade_sd's
`gamma_slim` at SD's best gamma), `sd_drafter_feature_best` (SD's gamma with the feature drafter),
`sd_drafter_self_best` (SD's gamma with the target's first layers drafting, `models.self_drafter`).
"""

from __future__ import annotations

import hashlib

from ..config import Pair, Params
from .cells import takes_sd_best
from .runs import parse_run
from .slims import feature_drafter_dir, use_self_drafter

BASELINE_BESTS = ("self_sd_best", "cascade_sd_best", "sd_drafter_feature_best", "sd_drafter_self_best")
BASELINE_KEYS = ("gamma", "decode_wall_per_token", "wall_per_token", "rejection_rate", "acceptance_rate", "fidelity")


def wants_best(params: Params, method: str, drafter: str = "model") -> bool:
    """A run of the grid with `method` (drafted by `drafter`) decodes at its own best setting on dev
    (`decode.sd_gamma: best`, no gamma ablation; cascade_sd also `decode.gamma_slim: null`)."""
    if method == "cascade_sd" and params.decode.gamma_slim is not None:
        return False
    specs = [parse_run(r) for r in params.study.runs]
    return any(s.method == method and s.drafter == drafter and takes_sd_best(params, s) for s in specs)


def drafter_digest(params: Params, pair: Pair) -> str:
    """The feature drafter's weights, as a digest: a retrained drafter makes the searches that use it new."""
    return hashlib.sha256((feature_drafter_dir(params, pair) / "feature_drafter.safetensors").read_bytes()).hexdigest()


def baseline_signature(params: Params, pair: Pair) -> dict:
    """What the DIMR slim's search adds to its signature for the baselines it measures (`BASELINE_BESTS`)."""
    out = {}
    if wants_best(params, "self_sd"):
        out["self_sd_best"] = True
    if wants_best(params, "cascade_sd"):
        out["cascade_sd_best"] = True
    if wants_best(params, "sd", "feature"):
        out["sd_drafter_feature_best"] = drafter_digest(params, pair)
    if wants_best(params, "sd", "self"):
        out["sd_drafter_self_best"] = {"self_layers": params.self_drafter.layers}
    return out


def baseline_bests(params: Params, pair: Pair, dev, cfg, signature: dict, sd_gamma: int) -> dict:
    """The baselines' best settings on the search's dev prompts (`dev`, a `DevSet`; `cfg` its `ThresholdConfig`),
    for those the signature asks for; `sd_gamma`: SD's best gamma (cascade_sd's inner hop runs at it)."""
    from ..search.thresholds import cascade_sd_points, drafter_sd_points, self_sd_points

    def fastest(points: list[dict], *extra: str) -> dict:
        best = min(points, key=lambda t: t["decode_wall_per_token"])
        return {k: best.get(k) for k in (*extra, *BASELINE_KEYS)}

    out = {}
    if signature.get("self_sd_best"):
        out["self_sd_best"] = fastest(self_sd_points(dev, cfg))
    if "sd_drafter_feature_best" in signature:
        from ..decoding.feature_drafter import load_feature_drafter

        dev.models.feature_drafter = load_feature_drafter(feature_drafter_dir(params, pair), dev.models.target)
        out["sd_drafter_feature_best"] = fastest(drafter_sd_points(dev, cfg, "feature"))
    if "sd_drafter_self_best" in signature:
        use_self_drafter(params, dev.models)
        out["sd_drafter_self_best"] = fastest(drafter_sd_points(dev, cfg, "self"))
    if signature.get("cascade_sd_best"):
        points = cascade_sd_points(dev, cfg, sd_gamma)
        out["cascade_sd_best"] = {**fastest(points, "gamma_slim"),
                                  "searched": {str(p["gamma_slim"]): p["decode_wall_per_token"] for p in points}}
    return out
