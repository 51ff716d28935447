"""Which runners a decode uses, and how they share layers: the draft, the slim verifier(s), the full model and,
with reuse, the trunk they share.

Without reuse each model is a `ModelRunner` with a cache of its own. With reuse (`policy.reuse`, a method that
shares the trunk, one routed slim that keeps layer 0) the slim and the full model share layers `0..k-1`: one
`TrunkRunner` computes them once per position and each tier runs only its rest (`RestRunner`), or the head on
the trunk's output when the slim is a prefix (the early exit, `ExitRunner`). A feature drafter drafts from the
trunk's layers, so it splits the full model at the slim's trunk or, without one (`sd`, or reuse off), at its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from ..errors import PolicyError
from .compilation import compiled
from .feature_drafter import FeatureDrafter, FeatureDraftRunner, TrunkFeatures
from .intermediate import IndependentVerifier
from .kv_cache import model_cache
from .methods.base import Method
from .policy import DecodePolicy
from .reuse import ExitRunner, RestRunner, SharedPrefix, TrunkRunner, shared_prefix
from .runner import ModelRunner
from .slim import RoutingMask, SlimVerifier, num_decoder_layers


@dataclass
class RunnerLayout:
    """The runners of one decode. `trunk` is None without reuse; `slims` holds one runner per slim (empty for
    methods without a middle tier); `draft` is None for methods that do not draft with a model."""

    draft: ModelRunner | FeatureDraftRunner | None
    trunk: TrunkRunner | None
    slims: list
    target: ModelRunner | RestRunner


def shared_split(policy: DecodePolicy, method: Method,
                 slims: Sequence[SlimVerifier | IndependentVerifier]) -> SharedPrefix | None:
    """The slim/full split when `policy.reuse` applies: a method that shares the trunk, one routed slim that
    keeps layer 0 (a prefix-only mask included: the early exit) and a layout whose forward splits exactly
    (`reuse.SharedPrefix`); else None."""
    if not (policy.reuse and method.shares_trunk and policy.runs_slim and len(slims) == 1
            and isinstance(slims[0], SlimVerifier)):
        return None
    return shared_prefix(slims[0])


def _feature_split(target: nn.Module, feature: FeatureDrafter, split: SharedPrefix | None) -> SharedPrefix:
    """The split a feature drafter reads: the slim's, if it shares the drafter's trunk layers, else the target
    split after the drafter's own trunk (a clear error where neither is possible)."""
    if split is not None:
        raise PolicyError(f"the feature drafter reads layers 0..{feature.trunk_layers - 1} of the shared trunk, "
                          f"but the slim shares only layers 0..{split.k - 1} with the full model")
    own = shared_prefix(SlimVerifier(target, RoutingMask(tuple(range(feature.trunk_layers)),
                                                         num_decoder_layers(target))))
    if own is None:
        raise PolicyError("the feature drafter drafts from the target's leading layers, but this target's "
                          "forward does not split there (the reason is logged)")
    return own


def make_runners(policy: DecodePolicy, method: Method, target: nn.Module, draft: nn.Module | None,
                 slims: Sequence[SlimVerifier | IndependentVerifier], vocab_size: int, capacity: int) -> RunnerLayout:
    """Each model of the decode with its cache (`capacity` positions) and work counters. `draft` is the draft
    model, a `FeatureDrafter`, a `SlimVerifier` (a self-drafter: a shallower routing of the target with its own
    cache) or None (methods without a draft, or a draft with another tokenizer, which drafts through text)."""

    def runner(name, model, new_cache):
        return ModelRunner(name, compiled(model) if policy.compile else model, new_cache, vocab_size,
                           policy.exact_timing)

    kind = policy.cache
    feature = draft if isinstance(draft, FeatureDrafter) else None
    split = shared_split(policy, method, slims)
    own_split = feature is not None and (split is None or split.k < feature.trunk_layers)
    if own_split:
        split = _feature_split(target, feature, split)
    trunk = None
    if split is not None:  # slim and full model share layers 0..k-1: one trunk pass per position (reuse)
        weight = next(target.parameters())
        trunk = TrunkRunner(compiled(split.trunk) if policy.compile else split.trunk,
                            lambda: split.new_cache("trunk", kind, capacity), capacity,
                            target.get_input_embeddings().weight.shape[-1], weight.dtype, vocab_size,
                            policy.exact_timing,
                            capture=TrunkFeatures(target, feature.layers) if feature is not None else None)
        trunk.layers = split.k
        full = RestRunner("target", compiled(split.target_rest) if policy.compile else split.target_rest,
                          trunk, lambda: split.new_cache("target", kind, capacity), vocab_size, policy.exact_timing)
    else:
        full = runner("target", target, lambda: model_cache(target, kind, capacity))
    if split is not None and not own_split:
        if split.early_exit:  # the slim is the trunk itself: its pass is the head on the trunk's output
            slim_runners = [ExitRunner(split.slim_rest, trunk, vocab_size, policy.exact_timing)]
        else:
            slim_runners = [RestRunner("slim", compiled(split.slim_rest) if policy.compile else split.slim_rest,
                                       trunk, lambda: split.new_cache("slim", kind, capacity), vocab_size,
                                       policy.exact_timing)]
    else:
        slim_runners = [
            runner("slim" if len(slims) == 1 else f"slim{k}", s.model, (lambda s=s: s.new_cache(kind, capacity)))
            for k, s in enumerate(slims)
        ]
    if feature is not None:
        drafting = FeatureDraftRunner(feature, trunk, vocab_size, policy.exact_timing)
    elif isinstance(draft, SlimVerifier):
        drafting = runner("draft", draft.model, lambda: draft.new_cache(kind, capacity))
    elif draft is not None:
        drafting = runner("draft", draft, lambda: model_cache(draft, kind, capacity))
    else:
        drafting = None
    return RunnerLayout(drafting, trunk, slim_runners, full)
