"""The study grid's runs, the decode policy each one gets, shared Optuna storage, config checks."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from study_fixtures import smoke_params

from viasd import config
from viasd.config import ConfigError
from viasd.errors import StudyInputError
from viasd.search.storage import optuna_storage
from viasd.stages.dimr_search import grid_costs
from viasd.study.cells import run_inputs, run_policy
from viasd.study.runs import parse_run
from viasd.study.slims import slims_to_tune


@pytest.mark.parametrize("text, method, ablation, mask, gamma", [
    ("ar", "ar", None, None, None),
    ("viasd", "viasd", None, "main", None),
    ("cascade_sd", "cascade_sd", None, "main", None),
    ("viasd-mask_random", "viasd", "mask_random", "random", None),
    ("cascade_sd-mask_every_other", "cascade_sd", "mask_every_other", "every_other", None),
    ("viasd-cost_target", "viasd", "cost_target", "cost_target", None),
    ("viasd-independent", "viasd", "independent", None, None),
    ("viasd-no_tier2", "viasd", "no_tier2", "main", None),
    ("viasd-rules", "viasd", "rules", "main", None),
    ("viasd-oracle", "viasd", "oracle", "main", None),
    ("viasd-oracle_budget", "viasd", "oracle_budget", "main", None),
    ("sd-gamma_6", "sd", "gamma_6", None, 6),
    ("sd-drafter_feature", "sd", "drafter_feature", None, None),
    ("viasd-drafter_feature", "viasd", "drafter_feature", "main", None),
])
def test_runs_parse(text, method, ablation, mask, gamma):
    spec = parse_run(text)
    assert (spec.method, spec.ablation, spec.mask_kind, spec.gamma, spec.name) == (method, ablation, mask, gamma, text)
    assert spec.drafter == ("feature" if ablation == "drafter_feature" else "model")


@pytest.mark.parametrize("text, message", [
    ("beam", "unknown method 'beam'"),
    ("sd-mask_random", "only cascade_sd, self_sd and viasd have"),
    ("cascade_sd-no_tier2", "no_tier2 is a VIA-SD ablation"),
    ("cascade_sd-oracle", "oracle is a VIA-SD ablation"),
    ("ar-gamma_3", "ar has no draft block length"),
    ("viasd-gamma_0", "unknown ablation 'gamma_0'"),
    ("viasd-bigger", "unknown ablation 'bigger'"),
    ("self_sd-drafter_feature", "drafter_feature changes the drafter, which only sd, cascade_sd"),
])
def test_bad_runs_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_run(text)


def test_policy_and_inputs_of_each_run(tmp_path):
    params = config.load(smoke_params(tmp_path, {"study": {"runs": ["ar", "viasd", "viasd-cost_target"]},
                                                 "decode": {"gamma": 5, "spec_cascade": {"rule": "chow", "alpha": 0.3}}}))
    assert grid_costs(params) == ["path", "target"]
    assert run_inputs(params, "smoke", "stdlib_continuation", "ar") == {}
    inputs = run_inputs(params, "smoke", "stdlib_continuation", "viasd-mask_truncate")
    assert inputs["mask"].name == "truncate.json"
    assert inputs["thresholds"].relative_to(params.models_dir).parts == ("thresholds", "smoke-stdlib_continuation",
                                                                         "mask_truncate.json")
    # the thresholds each viasd run reads: its own slim's (thresholds.per_slim), cost_<dimr.cost> is the main mask
    assert run_inputs(params, "smoke", "humaneval", "viasd-cost_path")["thresholds"].name == "main.json"
    assert run_inputs(params, "smoke", "humaneval", "viasd-independent")["thresholds"].name == "independent.json"
    assert run_inputs(params, "smoke", "humaneval", "viasd-no_tier2")["thresholds"].name == "main.json"
    # cascade_sd at SD's best gamma reads it from the DIMR slim's search; at a fixed gamma it reads no thresholds
    assert run_inputs(params, "smoke", "humaneval", "cascade_sd-mask_random")["thresholds"].name == "main.json"
    assert "thresholds" not in run_inputs(params, "smoke", "humaneval", "sd-gamma_4")
    assert slims_to_tune(params) == ["main", "cost_target"]
    (tmp_path / "shared").mkdir()
    shared = config.load(smoke_params(tmp_path / "shared", {"thresholds": {"per_slim": False}}))
    # the smoke grid's viasd-rules run: the hand rules' own search, whatever thresholds.per_slim says
    assert slims_to_tune(shared) == ["main", "rules"]
    assert run_inputs(shared, "smoke", "humaneval", "viasd-rules")["thresholds"].name == "rules.json"
    assert run_inputs(shared, "smoke", "humaneval", "viasd-oracle")["thresholds"].name == "main.json"
    assert run_inputs(shared, "smoke", "humaneval", "viasd-mask_random")["thresholds"].name == "main.json"
    assert run_inputs(params, "smoke", "humaneval", "viasd-cost_target")["mask"].name == "cost-target.json"
    assert "mask" not in run_inputs(params, "smoke", "humaneval", "viasd-independent")

    # sd at its own best gamma on dev, which the search's file names; one clear error before it has run
    with pytest.raises(config.ConfigError, match="sd decodes at its best gamma on dev"):
        run_policy(params, "smoke", "stdlib_continuation", "sd")
    assert run_policy(params, "smoke", "stdlib_continuation", "sd-gamma_4").gamma == 4
    fixed = replace(params, decode=replace(params.decode, sd_gamma=3))
    assert run_policy(fixed, "smoke", "stdlib_continuation", "sd").gamma == 3
    assert "thresholds" not in run_inputs(fixed, "smoke", "stdlib_continuation", "sd")
    spec = run_policy(params, "smoke", "stdlib_continuation", "spec_cascade-gamma_2")
    assert (spec.rule, spec.alpha, spec.gamma) == ("chow", 0.3, 2)
    with pytest.raises(StudyInputError, match="the tuned thresholds .* does not exist"):
        run_policy(params, "smoke", "stdlib_continuation", "viasd")
    tuned = {"gamma": 3, "tau_accept": 2.5, "tau_slim": 0.7, "score": "ratio_argmax", "confidence": "margin"}
    path = run_inputs(params, "smoke", "stdlib_continuation", "viasd")["thresholds"]
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(tuned))
    with pytest.raises(config.ConfigError, match="names no sd_best setting"):
        run_policy(params, "smoke", "stdlib_continuation", "sd")
    path.write_text(json.dumps({**tuned, "sd_best": {"gamma": 2}}))
    sd = run_policy(params, "smoke", "stdlib_continuation", "sd")
    assert (sd.method, sd.gamma) == ("sd", 2) and sd.max_new_tokens == params.tasks["stdlib_continuation"]["max_new_tokens"]
    # cascade_sd at its own gamma_slim on dev (decode.gamma_slim null): one clear error before the search named it
    with pytest.raises(config.ConfigError, match="names no cascade_sd_best setting"):
        run_policy(params, "smoke", "stdlib_continuation", "cascade_sd")
    path.write_text(json.dumps({**tuned, "sd_best": {"gamma": 2}, "cascade_sd_best": {"gamma": 2, "gamma_slim": 6}}))
    cascade = run_policy(params, "smoke", "stdlib_continuation", "cascade_sd")
    assert (cascade.gamma, cascade.gamma_slim) == (2, 6)
    set_slim = replace(params, decode=replace(params.decode, gamma_slim=4))
    cascade = run_policy(set_slim, "smoke", "stdlib_continuation", "cascade_sd")
    assert (cascade.gamma, cascade.gamma_slim) == (2, 4)
    assert run_policy(params, "smoke", "stdlib_continuation", "spec_cascade").gamma == 5  # lossy: decode.gamma
    viasd = run_policy(params, "smoke", "stdlib_continuation", "viasd")
    assert (viasd.gamma, viasd.tau_accept, viasd.tau_slim, viasd.score, viasd.confidence) == tuple(tuned.values())
    no_tier2 = run_policy(params, "smoke", "stdlib_continuation", "viasd-no_tier2")
    assert math.isinf(no_tier2.tau_slim) and no_tier2.tau_accept == 2.5
    assert run_policy(params, "smoke", "stdlib_continuation", "viasd-gamma_6").gamma == 6
    # the oracle at the tuned gamma, every tier its own (none switched off, even if the tuned policy is SD)
    path.write_text(json.dumps({**tuned, "tau_accept": "inf", "tau_slim": "inf"}))
    oracle = run_policy(params, "smoke", "stdlib_continuation", "viasd-oracle")
    assert (oracle.router, oracle.gamma, oracle.tiers_off, oracle.verify_lagged) == ("oracle", 3, False, False)
    assert oracle.oracle_budget == 0.0
    # the budgeted oracle spends what the search's fidelity floor allows (smoke: 0.5); without a floor, one error
    budgeted = run_policy(params, "smoke", "stdlib_continuation", "viasd-oracle_budget")
    assert (budgeted.router, budgeted.gamma, budgeted.oracle_budget) == ("oracle", 3, pytest.approx(0.5))
    no_floor = replace(params, thresholds=replace(params.thresholds, search={**params.thresholds.search, "quality": {}}))
    with pytest.raises(config.ConfigError, match="min_fidelity, which is None: set a floor below 1"):
        run_policy(no_floor, "smoke", "stdlib_continuation", "viasd-oracle_budget")


def test_shared_optuna_storage_is_seen_by_another_worker(tmp_path):
    import optuna

    params = config.load(smoke_params(tmp_path, {"study": {"optuna_storage": "shared/journal.log"}}))

    def storage():
        return optuna_storage(params.study.optuna_storage, tmp_path / "unused.db", params.models_dir.parent)

    first = optuna.create_study(storage=storage(), study_name="s")
    first.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    other = optuna.load_study(storage=storage(), study_name="s")
    assert len(other.trials) == 3 and (tmp_path / "shared" / "journal.log").exists()
    assert not (tmp_path / "unused.db").exists()
    local = config.load(smoke_params(tmp_path))
    default = optuna_storage(local.study.optuna_storage, tmp_path / "o" / "x.db", local.models_dir.parent)
    assert default == f"sqlite:///{tmp_path / 'o' / 'x.db'}"


@pytest.mark.parametrize("change, message", [
    ({"study": {"pairs": ["nope"]}}, "study.pairs.0: 'nope' is neither models.family nor one of models.hub_pairs"),
    ({"study": {"tasks": ["gsm8k"]}}, "study.tasks.0: 'gsm8k' has no entry under tasks"),
    ({"study": {"runs": ["sd-no_tier2"]}}, "study.runs.0: 'sd-no_tier2': no_tier2 is a VIA-SD ablation"),
    ({"models": {"hub_pairs": {"hp": {"target": "org/t", "draft": "org/d"}}}, "study": {"pairs": ["hp"],
      "runs": ["viasd-independent"]}}, "models.hub_pairs.hp.independent is not set"),
    ({"study": {"runs": ["viasd-oracle_budget"]}, "thresholds": {"quality": {"min_fidelity": None}}},
     "study.runs.0: 'viasd-oracle_budget' spends the fidelity budget down to thresholds.quality.min_fidelity, which is "
     "None: set a floor below 1"),
    ({"decode": {"split": "train"}}, "decode.split: 'train' is not one of"),
    ({"decode": {"generation": {"num_beams": 4}}}, "decode.generation: Additional properties are not allowed ('num_beams'"),
    ({"models": {"device": "gpu0"}}, "models.device: 'gpu0' does not match"),
])
def test_study_section_errors_name_the_key(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config.load(smoke_params(tmp_path, change))


def test_hub_pair_resolves_to_its_ids(tmp_path):
    params = config.load(smoke_params(tmp_path, {"models": {"hub_pairs": {"hp": {
        "target": "org/big", "draft": "org/small", "dtype": "bfloat16"}}},
        "study": {"pairs": ["hp", "smoke"], "runs": ["ar", "viasd"]}}))
    hp = params.pair("hp")
    assert (hp.target, hp.draft, hp.independent, hp.trained, hp.dtype) == ("org/big", "org/small", None, False, "bfloat16")
    assert params.pair().name == "hp" and params.pair("smoke").trained
    with pytest.raises(ConfigError, match="unknown pair 'x'"):
        params.pair("x")


def test_prefix_ablation_is_its_own_dimr_search(tmp_path):
    """`viasd-prefix_<n>`: a DIMR mask searched keeping layers 0..n-1, with its own files and thresholds."""
    from viasd.stages.dimr_search import grid_searches
    from viasd.study.paths import mask_paths
    from viasd.study.slims import mask_file, slim_name, slims_to_tune

    params = config.load(smoke_params(tmp_path, {"study": {"runs": ["ar", "viasd", "viasd-prefix_1", "viasd-prefix_2",
                                                                    "viasd-cost_target", "viasd-prefix_0"]}}))
    spec = parse_run("viasd-prefix_2")
    assert (spec.prefix, spec.mask_kind) == (2, "prefix_2")
    assert grid_searches(params) == [{}, {"cost": "target"}, {"keep_prefix": 1}, {"keep_prefix": 2}]
    assert mask_file(params, "smoke", spec) == mask_paths(params, "smoke", prefix=2)["mask"]
    assert mask_file(params, "smoke", spec).name == "prefix-2.json"
    assert slim_name(params, parse_run("viasd-prefix_0")) == "main"  # dimr.keep_prefix is 0: the main search
    assert slims_to_tune(params) == ["main", "prefix_1", "prefix_2", "cost_target"]
    with pytest.raises(ValueError, match="only cascade_sd, self_sd and viasd have"):
        parse_run("sd-prefix_2")
