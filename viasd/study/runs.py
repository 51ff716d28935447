"""The decode grid's runs: a method, optionally with one ablation (docs/method.md (methods and ablations)), as `method` or
`method-ablation` (the name used in file names, Snakemake wildcards and DVC matrix keys).

Ablations:
  mask_random / mask_truncate / mask_every_other   the slim verifier routed by a baseline mask
  cost_path / cost_target                           the DIMR mask searched with that cost function
  prefix_<n>                                        the DIMR mask searched keeping layers 0..n-1 (shared
                                                    with the full model: reuse; compares prefix sizes)
  independent                                       a separately trained model in the slim's place
  no_tier2                                          VIA-SD without tier 2 (tau_slim = inf)
  rules                                             VIA-SD with the hand-set tier rules (score / confidence
                                                    thresholds), tuned without the learned router
  oracle                                            VIA-SD decided by the oracle router (the target's greedy
                                                    token, peeked apart): the ceiling of any router
  oracle_budget                                     the budgeted oracle at the fidelity floor (it may settle
                                                    1 - thresholds.quality.min_fidelity of its tokens wrong):
                                                    the ceiling of a router that spends the same fidelity
  gamma_<n>                                         draft block length n instead of the tuned/default one
  drafter_feature                                   the feature drafter (EAGLE-3-style, on the target's shared
                                                    trunk; `viasd train-drafter`) drafts in the draft model's
                                                    place: `sd` at its own best gamma with it on dev, `viasd`
                                                    with its own router and threshold search
  drafter_self                                      the target's own first layers (`models.self_drafter`) draft
                                                    in the draft model's place (self-speculation), the DIMR slim
                                                    is the deeper middle tier: as drafter_feature, no training
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..decoding.policy import METHODS

ROUTED = ("cascade_sd", "self_sd", "viasd")  # methods with a slim verifier (self_sd: the slim drafts)
VIASD_ONLY = ("no_tier2", "rules", "oracle", "oracle_budget")  # ablations of VIA-SD's tier decisions
# ablations that put another slim verifier in the DIMR mask's place (see study/slims.py)
SLIM_ABLATIONS = ("mask_random", "mask_truncate", "mask_every_other", "cost_path", "cost_target", "independent")
DRAFTING = ("sd", "cascade_sd", "spec_cascade", "viasd")  # methods a drafter drafts for
DRAFTER_FEATURE = "drafter_feature"
DRAFTER_SELF = "drafter_self"
DRAFTER_ABLATIONS = {DRAFTER_FEATURE: "feature", DRAFTER_SELF: "self"}
_GAMMA = re.compile(r"gamma_([1-9][0-9]*)$")
_PREFIX = re.compile(r"prefix_(0|[1-9][0-9]*)$")


@dataclass(frozen=True)
class RunSpec:
    method: str
    ablation: str | None = None

    @property
    def name(self) -> str:
        return self.method if self.ablation is None else f"{self.method}-{self.ablation}"

    @property
    def routed(self) -> bool:
        return self.method in ROUTED

    @property
    def mask_kind(self) -> str | None:
        """`main`, a baseline name, `cost_<fn>`, or None (no routed slim: the independent model or no slim)."""
        if not self.routed or self.ablation == "independent":
            return None
        if self.ablation and self.ablation.startswith("mask_"):
            return self.ablation[len("mask_"):]
        if self.ablation and (self.ablation.startswith("cost_") or self.prefix is not None):
            return self.ablation
        return "main"

    @property
    def own_search(self) -> bool:
        """Its slim needs a DIMR search of its own: another cost function (`cost_<fn>`) or a kept prefix
        (`prefix_<n>`); whether that search is the main one depends on `dimr` (`stages.dimr_search.grid_searches`)."""
        return bool(self.ablation) and (self.ablation.startswith("cost_") or self.prefix is not None)

    @property
    def prefix(self) -> int | None:
        match = _PREFIX.match(self.ablation or "")
        return int(match.group(1)) if match else None

    @property
    def drafter(self) -> str:
        """Who drafts: `feature` (the feature drafter), `self` (the target's first layers) or `model` (the draft
        model)."""
        return DRAFTER_ABLATIONS.get(self.ablation or "", "model")

    @property
    def gamma(self) -> int | None:
        match = _GAMMA.match(self.ablation or "")
        return int(match.group(1)) if match else None


def parse_run(text: str) -> RunSpec:
    """`viasd-mask_random` -> RunSpec("viasd", "mask_random"); a ValueError says what is wrong."""
    method, _, ablation = str(text).partition("-")
    if method not in METHODS:
        raise ValueError(f"{text!r}: unknown method {method!r}; methods: {', '.join(METHODS)}")
    if not ablation:
        return RunSpec(method)
    spec = RunSpec(method, ablation)
    if spec.gamma is not None:
        if method == "ar":
            raise ValueError(f"{text!r}: ar has no draft block length")
        return spec
    if ablation in SLIM_ABLATIONS or spec.prefix is not None:
        if method not in ROUTED:
            raise ValueError(f"{text!r}: {ablation} changes the slim verifier, which only "
                             f"{', '.join(ROUTED[:-1])} and {ROUTED[-1]} have")
        return spec
    if ablation in DRAFTER_ABLATIONS:
        if method not in DRAFTING:
            raise ValueError(f"{text!r}: {ablation} changes the drafter, which only {', '.join(DRAFTING)} have")
        return spec
    if ablation in VIASD_ONLY:
        if method != "viasd":
            raise ValueError(f"{text!r}: {ablation} is a VIA-SD ablation")
        return spec
    raise ValueError(f"{text!r}: unknown ablation {ablation!r}; ablations: {', '.join(SLIM_ABLATIONS)}, "
                     f"{', '.join(VIASD_ONLY)}, {', '.join(DRAFTER_ABLATIONS)}, gamma_<n>, prefix_<n>")
