"""The benchmark's methods: their names (ours, our VIA-SD variants and other drafters, transformers' own) and the
decoding each stands for (`method_table`: a `BenchMethod` per name, with the policy or the transformers settings it
runs), apart from the timing that runs them (`bench/timing.py`).

Pure library code: models and settings in, methods out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..decoding.policy import METHODS, DecodePolicy
from ..decoding.tier_router import oracle_settings
from ..errors import BenchError
from ..models import ModelSet

# VIA-SD variants beside the tuned `viasd`: the oracle router (the ceiling of any router: the target's greedy
# token decides, its peek passes not counted), the budgeted oracle at the fidelity floor (the ceiling of a router
# that spends the same fidelity) and the hand-set rules tuned on their own (the rules ablation)
VIASD_VARIANTS = ("viasd-oracle", "viasd-oracle_budget", "viasd-rules")
# the methods again with the feature drafter (EAGLE-3-style, on the target's trunk) in the draft model's place
FEATURE = "-drafter_feature"
FEATURE_VARIANTS = ("sd" + FEATURE, "viasd" + FEATURE)
# and with the self-drafter (`bench --draft-layers`: the target's leading layers draft; VIA-SD's slim, deeper, is the
# middle tier) with the draft model's tuned thresholds: no search has tuned them for this drafter
SELF = "-drafter_self"
SELF_VARIANTS = ("sd" + SELF, "viasd" + SELF)
# `sd` drafting a tree (`draft_tree.py`) with each drafter, at the bench's `tree` shape (`--tree-nodes`, `--tree-top-k`),
# beside the same drafter's chain at the same gamma
TREE = "sd-tree"
TREE_VARIANTS = (TREE, TREE + FEATURE, TREE + SELF)
DEFAULT_TREE = {"tree_nodes": 16, "tree_top_k": 4}
# transformers' own: greedy generate, assisted generation with the draft (its heuristic schedule, and a fixed
# `gamma` tokens per round), and its self-speculation (`assistant_early_exit`: the target's first layers draft)
HF = ("hf_ar", "hf_assisted", "hf_assisted_fixed", "hf_assisted_heuristic", "hf_early_exit")
# transformers' assisted generation, by how the draft length is set: the assistant's generation config as it is
# (transformers 5's defaults: 20 tokens, stopping early where the draft's confidence falls below 0.4, the
# dynamic speculation lookahead), `gamma` fixed, and the heuristic schedule from `gamma` (+2 after a fully
# accepted round, -1 otherwise; reset per call): (num_assistant_tokens, schedule, confidence threshold)
ASSISTED = {"hf_assisted": None, "hf_assisted_fixed": ("gamma", "constant", 0.0),
            "hf_assisted_heuristic": ("gamma", "heuristic_transient", 0.0)}




@dataclass(frozen=True)
class BenchMethod:
    name: str
    policy: DecodePolicy | None = None  # ours
    # hf_assisted_*: the assistant's (num_assistant_tokens, schedule, confidence threshold); None: its own config
    assistant: tuple[int, str, float] | None = None
    early_exit: int | None = None  # hf_early_exit: the layers that draft (transformers' assistant_early_exit)


def method_table(models: ModelSet, names: list[str], gamma: int, max_new_tokens: int, viasd: dict | None = None,
                 spec_cascade: dict | None = None, engine: dict | None = None,
                 variants: dict[str, dict] | None = None, oracle_budget: float | None = None,
                 baselines: dict[str, dict] | None = None, tree: dict | None = None) -> list[BenchMethod]:
    """The benchmark's methods: ours with `gamma` (viasd with its tuned thresholds when given; `variants`:
    the settings of `VIASD_VARIANTS`, e.g. the rules' own tuned thresholds; `oracle_budget`: the budgeted
    oracle's, `1 - ` the fidelity floor; `baselines`: a lossless baseline's own settings over `gamma`, e.g.
    self_sd's and cascade_sd's best on dev; `tree`: the `TREE_VARIANTS`' `tree_nodes`, `tree_top_k` and, where given,
    their depth `gamma`), and HF's."""
    out = _methods(models, names, gamma, max_new_tokens, viasd, spec_cascade, engine, variants, oracle_budget, baselines,
                   tree)
    if any(m.name not in DRAFTLESS and (m.policy is None or m.policy.drafter == "model") for m in out) \
            and models.draft is None:
        raise BenchError("the speculative methods but self_sd and the -drafter_ ones need a draft model")
    return out


def _methods(models: ModelSet, names: list[str], gamma: int, max_new_tokens: int, viasd: dict | None = None,
             spec_cascade: dict | None = None, engine: dict | None = None,
             variants: dict[str, dict] | None = None, oracle_budget: float | None = None,
             baselines: dict[str, dict] | None = None, tree: dict | None = None) -> list[BenchMethod]:
    """The policies of `method_table`, before its check that a draft model is there for those that need one."""
    base = DecodePolicy(method="ar", gamma=gamma, max_new_tokens=max_new_tokens, eos_token_ids=(), exact_timing=True,
                        **(engine or {}))
    out = []
    for name in names:
        if name in TREE_VARIANTS:  # the same drafter's chain `sd` at the same settings, drafting a tree
            (chain,) = _methods(models, ["sd" + name[len(TREE):]], gamma, max_new_tokens, viasd, spec_cascade, engine,
                                variants, oracle_budget, baselines)
            out.append(BenchMethod(name, replace(chain.policy, **{**DEFAULT_TREE, **(tree or {})})))
        elif name in FEATURE_VARIANTS or name in SELF_VARIANTS:
            # SD and VIA-SD on another drafter: SD at its own best gamma, VIA-SD with its own search's thresholds,
            # where they ran (`baselines`, `variants`)
            drafter, suffix = ("feature", FEATURE) if name in FEATURE_VARIANTS else ("self", SELF)
            if drafter == "feature" and models.feature_drafter is None:
                raise BenchError(f"{name} drafts with the pair's feature drafter: train it first (`viasd train-drafter`)")
            if drafter == "self" and models.self_drafter is None:
                raise BenchError(f"{name} drafts with the target's own layers: name them (--draft-layers 0,1)")
            (own,) = _methods(models, [name[: -len(suffix)]], gamma, max_new_tokens, viasd, spec_cascade, engine,
                              variants, oracle_budget, baselines)
            settings = {**(baselines or {}).get(name, {}), **(variants or {}).get(name, {})}
            out.append(BenchMethod(name, replace(own.policy, drafter=drafter, **settings)))
        elif name == "hf_ar":
            out.append(BenchMethod(name))
        elif name in ASSISTED:
            setting = ASSISTED[name]
            out.append(BenchMethod(name, assistant=None if setting is None else (gamma, *setting[1:])))
        elif name == "hf_early_exit":
            out.append(BenchMethod(name, early_exit=early_exit_layers(models)))
        elif name == "viasd":
            out.append(BenchMethod(name, replace(base, method="viasd", **(viasd or {}))))
        elif name in VIASD_VARIANTS:
            if name == "viasd-oracle_budget" and oracle_budget is None:
                raise BenchError("viasd-oracle_budget spends the fidelity down to a floor: set "
                                 "thresholds.quality.min_fidelity below 1")
            tuned_gamma = (viasd or {}).get("gamma")
            default = {"viasd-oracle": oracle_settings(tuned_gamma),
                       "viasd-oracle_budget": oracle_settings(tuned_gamma, oracle_budget or 0.0)}.get(name, viasd)
            settings = (variants or {}).get(name, default)
            out.append(BenchMethod(name, replace(base, method="viasd", **(settings or {}))))
        elif name == "spec_cascade":
            out.append(BenchMethod(name, replace(base, method="spec_cascade", **(spec_cascade or {}))))
        elif name in METHODS:
            out.append(BenchMethod(name, replace(base, method=name, **(baselines or {}).get(name, {}))))
        else:
            raise BenchError(f"unknown benchmark method {name!r}; choose from "
                             f"{', '.join(METHODS + VIASD_VARIANTS + FEATURE_VARIANTS + SELF_VARIANTS + TREE_VARIANTS + HF)}")
    if any(m.name in ("cascade_sd", "self_sd", "viasd", *VIASD_VARIANTS) for m in out) and not models.slims:
        raise BenchError("cascade_sd, self_sd and viasd need a slim verifier (a routing mask)")
    return out


DRAFTLESS = ("ar", "hf_ar", "self_sd", "hf_early_exit")  # methods that load no draft model


def early_exit_layers(models: ModelSet) -> int:
    """The leading layers the pair's slim keeps (`self_sd`'s early exit, when the mask is a prefix): what
    `hf_early_exit` drafts with, so that transformers' self-speculation and ours draft alike."""
    from ..decoding.reuse import prefix_length
    from ..decoding.slim import SlimVerifier

    slim = models.slims[0] if models.slims else None
    k = prefix_length(slim.mask.keep_layers) if isinstance(slim, SlimVerifier) else 0
    if not k or k != len(slim.mask.keep_layers):
        raise BenchError("hf_early_exit drafts with the target's first layers: the pair's slim must keep a prefix "
                         "of its layers (a mask 0..k-1), as the default family's DIMR mask does")
    return k
