"""The slim verifier a run of the grid uses, and the models it loads.

A *slim* names what stands in the slim verifier's place:
  main              the pair's DIMR mask (searched with `dimr.cost`)
  mask_random, mask_truncate, mask_every_other    a baseline mask of the same budget
  cost_<fn>         the DIMR mask searched with the other cost function
  prefix_<n>        the DIMR mask searched keeping layers 0..n-1
  independent       a separately trained model (no routing)

With `thresholds.per_slim` (the default), every VIA-SD slim ablation of `study.runs` gets thresholds
tuned for its own slim under the same quality constraint, so the ablation compares slims at equal
quality; without it, every slim reuses the thresholds tuned for the DIMR mask.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..config import Pair, Params
from ..errors import StudyInputError
from .paths import main_cost, main_prefix, mask_paths
from .runs import SLIM_ABLATIONS, RunSpec, parse_run


def read_json(path: Path, what: str) -> dict:
    if not path.exists():
        raise StudyInputError(f"{what} {path} does not exist: run the stage that writes it first")
    return json.loads(path.read_text())


def slim_name(params: Params, spec: RunSpec) -> str:
    """The slim a routed run uses: `main`, or the ablation that replaces it (`cost_<dimr.cost>` is `main`)."""
    if spec.prefix is not None:
        return "main" if spec.prefix == main_prefix(params) else spec.ablation
    if spec.ablation not in SLIM_ABLATIONS or spec.ablation == f"cost_{main_cost(params)}":
        return "main"
    return spec.ablation


def per_slim(params: Params) -> bool:
    return params.thresholds.per_slim


def threshold_slim(params: Params, spec: RunSpec) -> str:
    """Whose tuned thresholds a `viasd` run reads: `rules` for the hand-rules ablation (the DIMR slim's
    thresholds searched without the learned router), `drafter_feature` / `drafter_self` for VIA-SD on the feature
    drafter / the target's first layers (the DIMR slim, searched with that drafter and its own router), else its
    slim's (`main` without `thresholds.per_slim`)."""
    if spec.ablation == "rules":
        return "rules"
    if spec.drafter != "model":  # VIA-SD on another drafter: its own search, with a router fitted on its blocks
        return spec.ablation
    return slim_name(params, spec) if per_slim(params) else "main"


def slims_to_tune(params: Params) -> list[str]:
    """`main`, plus every other threshold set a `viasd` run of `study.runs` reads: `rules` for the
    hand-rules ablation, and (with `thresholds.per_slim`) each slim ablation's."""
    slims = ["main"]
    for run in params.study.runs:
        spec = parse_run(run)
        if spec.method == "viasd" and threshold_slim(params, spec) not in slims:
            slims.append(threshold_slim(params, spec))
    return slims


def drafter_of(slim: str) -> str:
    """The drafter a threshold search drafts with: `feature` for `drafter_feature`, `self` for `drafter_self`,
    else the draft model (`model`)."""
    return slim_spec(slim).drafter if slim not in ("main", "rules") else "model"


def router_drafters(params: Params) -> list[str]:
    """The drafters a learned router is fitted for: the draft model's, and each other drafter a `viasd` run of
    the grid drafts with (its router is refitted on its own blocks)."""
    out = ["model"]
    for run in params.study.runs:
        spec = parse_run(run)
        if spec.method == "viasd" and spec.drafter not in out:
            out.append(spec.drafter)
    return out


def search_order(slims: list[str]) -> list[str]:
    """The searches of a stage that tunes `slims`, in the order the serial stage runs them: the hand rules'
    (`rules`), then `main`, then each other slim's. The first is every other search's starting point (its
    per-pass costs; the rules' trials compete in main's choice and warm-start the ablations)."""
    return [s for s in ("rules", "main") if s in slims] + [s for s in slims if s not in ("rules", "main")]


def slim_spec(slim: str) -> RunSpec:
    """The VIA-SD run that uses `slim` (`rules`: the DIMR slim, decided by the hand-set rules)."""
    return parse_run("viasd" if slim == "main" else f"viasd-{slim}")


def mask_file(params: Params, pair: str, spec: RunSpec) -> Path | None:
    """The routing mask a run loads, or None (no slim, or the independent model)."""
    kind = spec.mask_kind
    if kind is None:
        return None
    if kind == "main":
        return mask_paths(params, pair)["mask"]
    if kind.startswith("cost_"):
        return mask_paths(params, pair, kind[len("cost_"):])["mask"]
    if spec.prefix is not None:
        return mask_paths(params, pair, prefix=spec.prefix)["mask"]
    return mask_paths(params, pair)[kind]


def load_run_models(params: Params, pair: Pair, spec: RunSpec, mask: Path | None, device: str | None = None):
    """Target + draft of the pair, and the run's slim verifier (a routed mask or the independent model)."""
    return load_runs_models(params, pair, {spec.name: (spec, mask)}, device)[spec.name]


def load_runs_models(params: Params, pair: Pair, runs: dict[str, tuple[RunSpec, Path | None]],
                     device: str | None = None) -> dict:
    """One load of the pair for several runs: `{name: (spec, mask file or None)}` -> `{name: ModelSet}`,
    each with the run's slim verifier (a routed mask, or the independent model, loaded once), all
    sharing the target and the draft (loaded only if a run needs one), on `device` (default: params.yaml's
    `models.device`)."""
    from ..decoding.slim import RoutingMask, SlimVerifier, num_decoder_layers
    from ..models import load_models

    for spec, mask in runs.values():
        if mask is not None:
            read_json(mask, "the routing mask")  # a missing mask names the stage that writes it
        if spec.routed and spec.ablation == "independent" and not pair.independent:
            raise StudyInputError(f"pair {pair.name} has no independent model (models.hub_pairs.{pair.name}.independent)")
    needs_draft = any(spec.method not in ("ar", "self_sd") and spec.drafter == "model" for spec, _ in runs.values())
    device = device or params.device
    base = load_models(pair.target, draft=pair.draft if needs_draft else None, device=device, dtype=pair.dtype,
                       trust_remote_code=pair.trust_remote_code,
                       feature_drafter=feature_drafter_dir(params, pair)
                       if any(spec.drafter == "feature" for spec, _ in runs.values()) else None)
    n_layers = num_decoder_layers(base.target)
    independent = None
    out = {}
    for name, (spec, mask) in runs.items():
        slims = []
        if mask is not None:
            slims.append(SlimVerifier(base.target, RoutingMask.from_json(mask, n_layers)))
        if spec.routed and spec.ablation == "independent":
            if independent is None:
                independent = base.with_slims([]).add_independent_from(pair.independent, device, pair.dtype,
                                                                        pair.trust_remote_code)
            slims.append(independent)
        out[name] = base.with_slims(slims)
        if spec.drafter == "self":
            use_self_drafter(params, out[name])
    return out


def use_self_drafter(params: Params, models) -> None:
    """Set the study's self-drafter on `models` (a `ModelSet`): its target's first `models.self_drafter` layers
    draft for the `drafter: self` policies; one clear `ConfigError` where that is not shallower than the target."""
    from ..decoding.slim import num_decoder_layers

    models.set_self_drafter(params.self_drafter.keep_layers(num_decoder_layers(models.target)))


def feature_drafter_dir(params: Params, pair: Pair) -> Path:
    """The feature drafter a `drafter_feature` run of `pair` drafts with (`viasd train-drafter`: the embedded
    family's); one clear error for a hub pair or before it is trained."""
    if not pair.trained:
        raise StudyInputError(f"pair {pair.name}: the feature drafter is trained for the embedded family's target "
                              "(`viasd train-drafter`); a hub pair's drafter_feature runs have none")
    path = params.model_dir("feature_drafter")
    if not path.exists():
        raise StudyInputError(f"no feature drafter at {path}: run `viasd train-drafter` first")
    return path


def slim_description(params: Params, pair: str, spec: RunSpec):
    """What stands in the slim's place, for outputs: the kept layers, `independent`, or None."""
    if spec.routed and spec.ablation == "independent":
        return "independent"
    mask = mask_file(params, pair, spec)
    return read_json(mask, "the routing mask")["keep_layers"] if mask is not None else None
