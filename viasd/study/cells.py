"""One grid cell (pair, task, run) of the study: the files it reads and its decoding policy. This is the
one place where the parameters become a `DecodePolicy` for the study's runs (the decode stage, the
benchmark's tuned `viasd`, the threshold search's and the router's engine options)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError, Pair, Params
from ..decoding.policy import TUNED_FIELDS, DecodePolicy
from ..decoding.tier_router import floor_budget, oracle_settings
from .paths import router_paths, threshold_paths
from .runs import RunSpec, parse_run
from .slims import load_run_models, mask_file, read_json, threshold_slim

log = logging.getLogger(__name__)


def engine_options(params: Params, given: dict | None = None) -> dict:
    """The options of our methods that are not the method's own (`cache`, `compile`, `reuse`, the generation
    settings) from params.yaml's `decode`, with the non-None entries of `given` (command-line overrides) on
    top; `generation` settings are merged field by field."""
    base = params.decode.engine()
    given = {k: v for k, v in (given or {}).items() if v is not None}
    if "generation" in given:
        given["generation"] = {**base["generation"], **given["generation"]}
    return {**base, **given}


def search_base(params: Params, task: str) -> DecodePolicy:
    """The policy a threshold search varies on `task`'s dev prompts: viasd with the study's engine options,
    the task's `max_new_tokens` and stop strings."""
    from ..tasks import get_task

    return DecodePolicy(method="viasd", max_new_tokens=params.max_new_tokens(task),
                        stop_strings=tuple(get_task(task).stop_strings), **engine_options(params))


LOSSLESS_BASELINES = ("sd", "cascade_sd", "self_sd")  # decoded at their own best gamma (`decode.sd_gamma: best`)


def takes_sd_best(params: Params, spec: RunSpec) -> bool:
    """Whether the run decodes at the gamma the DIMR slim's search found cheapest for SD (a lossless baseline
    without a gamma ablation, with `decode.sd_gamma: best`)."""
    return spec.method in LOSSLESS_BASELINES and spec.gamma is None and params.decode.sd_gamma == "best"


def run_inputs(params: Params, pair: str, task: str, run: str | RunSpec) -> dict[str, Path]:
    """The files a run reads besides the pair's models and the task's prompts: its routing mask and, for
    `viasd`, the thresholds tuned for its slim (see `slims.threshold_slim`); for a lossless baseline at SD's
    best gamma, the DIMR slim's thresholds file, which names that gamma."""
    spec = parse_run(run) if isinstance(run, str) else run
    inputs = {}
    mask = mask_file(params, pair, spec)
    if mask is not None:
        inputs["mask"] = mask
    if spec.method == "viasd":
        inputs["thresholds"] = threshold_paths(params, task, pair, threshold_slim(params, spec))["json"]
    elif takes_sd_best(params, spec):
        inputs["thresholds"] = threshold_paths(params, task, pair, "main")["json"]
    if spec.drafter == "feature":
        inputs["drafter"] = params.model_dir("feature_drafter")
    return inputs


def best_key(params: Params, method: str, drafter: str = "model") -> str:
    """Where the DIMR slim's thresholds file names a lossless baseline's best setting on dev: `self_sd_best`
    (self-speculation's own gamma), `sd_drafter_feature_best` / `sd_drafter_self_best` (SD's gamma with the
    feature drafter / the target's first layers drafting),
    `cascade_sd_best` (cascade_sd's gamma_slim at SD's gamma, unless `decode.gamma_slim` fixes it), else
    `sd_best` (SD's gamma)."""
    if method == "sd" and drafter in ("feature", "self"):
        return f"sd_drafter_{drafter}_best"
    if method == "self_sd":
        return "self_sd_best"
    if method == "cascade_sd" and params.decode.gamma_slim is None:
        return "cascade_sd_best"
    return "sd_best"


def best_settings(params: Params, pair: str, task: str, method: str = "sd", drafter: str = "model"
                  ) -> dict[str, int]:
    """The `DecodePolicy` fields at which a lossless baseline was fastest on the task's dev prompts (the DIMR
    slim's threshold search, which decodes SD at every `thresholds.gamma`, and self_sd / cascade_sd when the
    grid has them): `gamma`, and `gamma_slim` for cascade_sd. One clear error before that search has run."""
    path = threshold_paths(params, task, pair, "main")["json"]
    if not path.exists():
        raise ConfigError(f"{method} decodes at its best gamma on dev, which the threshold search finds: no "
                          f"{path} yet (run `viasd tune-thresholds --pair {pair} --task {task}`), or set "
                          "decode.sd_gamma to a number")
    key = best_key(params, method, drafter)
    best = read_json(path, "the tuned thresholds").get(key)
    if best is None:
        raise ConfigError(f"{path} names no {key} setting (the search ran without it): run `viasd tune-thresholds "
                          f"--pair {pair} --task {task}` again, or set decode.sd_gamma to a number")
    return {"gamma": int(best["gamma"]), **({"gamma_slim": int(best["gamma_slim"])} if "gamma_slim" in best else {})}


def sd_best_gamma(params: Params, pair: str, task: str, method: str = "sd") -> int:
    """The gamma of `best_settings`."""
    return best_settings(params, pair, task, method)["gamma"]


def tuned_settings(params: Params, pair: str, task: str, slim: str = "main", required: bool = True) -> dict:
    """The `DecodePolicy` fields a slim's threshold search set for the pair and task (`slim`: `main`, `rules`
    for the hand rules tuned alone, or a slim ablation). Missing file: a clear error, or with `required`
    false an empty dict (the policy's defaults) and a logged warning."""
    path = threshold_paths(params, task, pair, slim)["json"]
    if not path.exists() and not required:
        log.warning("no tuned thresholds at %s; viasd runs with default thresholds", path)
        return {}
    tuned = read_json(path, "the tuned thresholds")
    return {k: tuned[k] for k in TUNED_FIELDS if k in tuned}


def load_pair_router(params: Params, pair: str, drafter: str = "model"):
    """The pair's learned router (`viasd train-router`) fitted on `drafter`'s blocks, for policies tuned with
    `router: learned`."""
    from ..training.tier_router import load_router

    return load_router(router_paths(params, pair, drafter)["router"])


def fidelity_floor(params: Params) -> float | None:
    """`thresholds.quality.min_fidelity`: the search's fidelity floor (None: none)."""
    return (params.thresholds.search.get("quality") or {}).get("min_fidelity")


def fidelity_budget(params: Params) -> float:
    """The budgeted oracle's budget, `1 - thresholds.quality.min_fidelity`; one clear error without a floor."""
    budget = floor_budget(fidelity_floor(params))
    if budget is None:
        raise ConfigError(f"the budgeted oracle spends the fidelity down to thresholds.quality.min_fidelity, which is "
                          f"{fidelity_floor(params)}: set a floor below 1")
    return budget


def run_policy(params: Params, pair: str, task: str, run: str | RunSpec) -> DecodePolicy:
    """The decoding policy of one grid cell: params.yaml's `decode` section, the tuned thresholds for
    `viasd`, SD's own best gamma for the lossless baselines (`decode.sd_gamma`), and the run's ablation on
    top (`sd-gamma_4`: SD at a fixed gamma)."""
    spec = parse_run(run) if isinstance(run, str) else run
    d = params.decode
    fields = {"method": spec.method, "gamma": d.gamma, "gamma_slim": d.gamma_slim, "rule": d.cascade_rule,
              "alpha": d.cascade_alpha, "max_lag": d.max_lag, "gate": d.gate, "verify_lagged": d.verify_lagged,
              "draft_stop": d.draft_stop,
              "seed": params.seed, **engine_options(params), "max_new_tokens": params.max_new_tokens(task)}
    if spec.method == "viasd":
        fields.update(tuned_settings(params, pair, task, threshold_slim(params, spec)))
    elif takes_sd_best(params, spec):
        fields.update(best_settings(params, pair, task, spec.method, spec.drafter))
    elif spec.method in LOSSLESS_BASELINES and spec.gamma is None:
        fields["gamma"] = int(d.sd_gamma)
    fields["drafter"] = spec.drafter
    if spec.ablation == "no_tier2":
        fields["tau_slim"] = math.inf
    if spec.ablation == "oracle":  # the tuned gamma and engine; the oracle decides every tier (none is off)
        fields.update(oracle_settings(fields["gamma"]))
    if spec.ablation == "oracle_budget":  # the same, spending the fidelity the search's floor allows
        fields.update(oracle_settings(fields["gamma"], fidelity_budget(params)))
    if spec.gamma is not None:
        fields["gamma"] = spec.gamma
    return DecodePolicy(**fields)


@dataclass(frozen=True)
class GridCell:
    """One cell of the study grid, (pair, task, run): what it reads and its decoding policy, each derived
    from the parameters in one place (its outputs: `paths.decode_paths`, `paths.eval_path`)."""

    params: Params
    pair: str
    task: str
    run: RunSpec

    @classmethod
    def of(cls, params: Params, pair: str, task: str, run: str | RunSpec) -> GridCell:
        return cls(params, pair, task, parse_run(run) if isinstance(run, str) else run)

    @property
    def inputs(self) -> dict[str, Path]:
        """Its routing mask and, for `viasd`, its tuned thresholds (`run_inputs`)."""
        return run_inputs(self.params, self.pair, self.task, self.run)

    def policy(self) -> DecodePolicy:
        return run_policy(self.params, self.pair, self.task, self.run)

    def load_models(self, policy: DecodePolicy | None = None, device: str | None = None):
        """The pair's models with this cell's slim verifier, on `device` (default: params.yaml's), and the
        pair's learned router when `policy` (default: the cell's own) decides its tiers with it."""
        policy = policy or self.policy()
        models = load_run_models(self.params, self.params.pair(self.pair), self.run, self.inputs.get("mask"), device)
        if policy.router == "learned":
            models.router = load_pair_router(self.params, self.pair, policy.drafter)
        return models


def input_files(params: Params, pair: Pair, task: str | None = None, run: str | None = None) -> dict:
    """A stage's inputs, for the `dvc_md5.*` tags of its MLflow run."""
    files = {"data.manifest": params.data.dir / "manifest.json"}
    if pair.trained:
        files.update({f"model.{r}": params.model_dir(r) for r in ("target", "draft")})
    if run is not None:
        files.update(run_inputs(params, pair.name, task, run))
        if "thresholds" in files:  # DVC tracks (and hashes) the pair x task's thresholds as one directory
            files["thresholds"] = files["thresholds"].parent
    return files


def study_policy(cell: GridCell) -> DecodePolicy:
    """The cell's policy with its task's stop strings added (what the decode stage and `viasd generate --pair`
    decode with)."""
    from dataclasses import replace

    from ..tasks import get_task

    base = cell.policy()
    return replace(base, stop_strings=tuple(dict.fromkeys(base.stop_strings + tuple(get_task(cell.task).stop_strings))))


def study_cell(study: str | Path = ".", task: str | None = None, pair: str | None = None, run: str = "viasd",
               config: Sequence[str | Path] = ()) -> GridCell:
    """One run of a finished study as a `GridCell`: `study` is the study's directory (its params.yaml; paths in it are
    relative to it) or the params file itself, `config` files merged over it (as `--config`); `task`: default
    `thresholds.task`; `pair`: default the first of `study.pairs`; `run`: a run of the grid (`viasd`, `sd`, ...)."""
    from ..config import load

    path = Path(study)
    params = load(path / "params.yaml" if path.is_dir() else path, list(config))
    task = task or params.thresholds.task
    if task not in params.tasks:
        raise ConfigError(f"task {task!r} is not a task of the study (tasks: {', '.join(params.tasks)})")
    return GridCell.of(params, params.pair(pair).name, task, run)


def load_study_run(study: str | Path = ".", task: str | None = None, pair: str | None = None, run: str = "viasd",
                   config: Sequence[str | Path] = (), device: str | None = None):
    """The models and decoding policy of one run of a finished study (`study_cell`): the pair's models with the run's
    slim verifier, its learned router and tuned thresholds, the task's stop strings, as the study decoded the task.
    Returns `(ModelSet, DecodePolicy)`."""
    cell = study_cell(study, task, pair, run, config)
    policy = study_policy(cell)
    return cell.load_models(policy, device), policy
