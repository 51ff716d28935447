"""The lossless baselines at their own best settings on dev, as the DIMR slim's threshold search measures them
(`study/baselines.py`): self_sd's gamma, cascade_sd's gamma_slim, SD's gamma with the feature drafter, and the
feature drafter's axis through the stages (its training, its refitted router, its own search, the decode)."""

import pytest
from study_fixtures import smoke_params

from viasd import config
from viasd.stages.dimr_search import run_dimr_stage
from viasd.stages.train_router import run_router_stage
from viasd.stages.tune_thresholds import run_thresholds_stage


def test_a_self_sd_run_decodes_at_its_own_best_gamma_on_dev(study, tmp_path):
    """With a `self_sd` run in the grid, the DIMR slim's search also decodes self-speculation at every searched
    gamma on the dev prompts (lossless: fidelity 1) and names its cheapest (`self_sd_best`); the search itself is
    the same study, resumed (the same choice), and the run's policy takes that gamma, as `sd` takes SD's."""
    import shutil

    from viasd.decoding.policy import TUNED_FIELDS
    from viasd.study.cells import run_policy

    _, params = study
    run_dimr_stage(params, progress=False)
    run_router_stage(params, progress=False)
    before = run_thresholds_stage(params, progress=False, slims=["rules", "main"])["main"]
    assert "self_sd_best" not in before
    # the smoke grid has cascade_sd: its gamma_slim searched at SD's best gamma, the fastest taken by its run
    cascade = before["cascade_sd_best"]
    assert cascade["gamma"] == before["sd_best"]["gamma"] and cascade["fidelity"] == 1.0
    assert sorted(map(int, cascade["searched"])) == [k * cascade["gamma"] for k in (1, 2, 3)]
    assert cascade["decode_wall_per_token"] == min(cascade["searched"].values())
    policy = run_policy(params, "smoke", "stdlib_continuation", "cascade_sd")
    assert (policy.gamma, policy.gamma_slim) == (cascade["gamma"], cascade["gamma_slim"])
    from viasd.bench.command import baseline_settings  # the bench's cascade_sd takes the same

    assert baseline_settings(params, "smoke", "stdlib_continuation") == {
        "cascade_sd": {"gamma": cascade["gamma"], "gamma_slim": cascade["gamma_slim"]}}
    models = tmp_path / "models"  # a copy: the session's study keeps its own thresholds files
    shutil.copytree(params.models_dir, models)
    with_self = config.load(smoke_params(tmp_path, {"data": {"dir": str(params.data.dir)}, "models": {"dir": str(models)},
                                                    "study": {"runs": [*params.study.runs, "self_sd"]}}))
    after = run_thresholds_stage(with_self, progress=False, slims=["rules", "main"])["main"]
    assert not after.get("up_to_date") and after["signature"]["self_sd_best"] is True
    best = after["self_sd_best"]
    assert best["gamma"] in with_self.thresholds.search["gamma"] and best["fidelity"] == 1.0
    assert {k: after.get(k) for k in TUNED_FIELDS} == {k: before.get(k) for k in TUNED_FIELDS}
    policy = run_policy(with_self, "smoke", "stdlib_continuation", "self_sd")
    assert policy.method == "self_sd" and policy.gamma == best["gamma"]
    assert run_policy(with_self, "smoke", "stdlib_continuation", "sd").gamma == after["sd_best"]["gamma"]


def test_which_lossless_baselines_the_dev_search_measures(tmp_path):
    """self_sd's gamma and cascade_sd's gamma_slim are searched on dev only for runs of the grid that take their
    best setting (`decode.sd_gamma: best`, no gamma ablation; cascade_sd with `decode.gamma_slim: null`); a fixed
    gamma_slim is decoded as set."""
    from viasd.study.baselines import wants_best
    from viasd.study.cells import best_key

    def load(decode: dict, runs: list[str]):
        return config.load(smoke_params(tmp_path, {"decode": decode, "study": {"runs": runs}}))

    assert wants_best(load({}, ["ar", "cascade_sd"]), "cascade_sd") and not wants_best(load({}, ["cascade_sd"]), "self_sd")
    assert not wants_best(load({}, ["ar", "cascade_sd-gamma_4"]), "cascade_sd")
    fixed = load({"gamma_slim": 4}, ["ar", "cascade_sd"])
    assert not wants_best(fixed, "cascade_sd") and best_key(fixed, "cascade_sd") == "sd_best"
    assert not wants_best(load({"sd_gamma": 3}, ["cascade_sd"]), "cascade_sd")
    assert wants_best(load({}, ["self_sd"]), "self_sd") and not wants_best(load({"sd_gamma": 3}, ["self_sd"]), "self_sd")
    drafted = config.load(smoke_params(tmp_path, {"study": {"runs": ["ar", "sd-drafter_feature"], "drafters": ["feature"]}}))
    assert wants_best(drafted, "sd", "feature") and not wants_best(drafted, "sd")


def _grid_beside(study, tmp_path, runs: list[str], models: dict | None = None, study_section: dict | None = None):
    """The session's smoke study through its DIMR search, router and first searches, then a grid of `runs` on a
    copy of its models (the session's study keeps its own files): the parameters of that grid."""
    import shutil

    _, params = study
    run_dimr_stage(params, progress=False)
    run_router_stage(params, progress=False)
    run_thresholds_stage(params, progress=False, slims=["rules", "main"])
    copied = tmp_path / "models"
    shutil.copytree(params.models_dir, copied)
    return config.load(smoke_params(tmp_path, {
        "data": {"dir": str(params.data.dir)}, "models": {"dir": str(copied), **(models or {})},
        "study": {"runs": runs, "reports": str(tmp_path / "reports"), **(study_section or {})}}))


def test_the_feature_drafter_axis_through_the_stages(study, tmp_path):
    """`viasd train-drafter` trains the smoke family's feature drafter; with an `sd-drafter_feature` run in the
    grid the DIMR slim's search also decodes SD with it at every gamma on dev (lossless) and names its fastest
    (`sd_drafter_feature_best`), which the run takes; `viasd-drafter_feature` gets a router refitted on the feature
    drafter's blocks and a threshold search of its own (with its oracle ceiling); the decode stage decodes
    `sd-drafter_feature` (ar's tokens) and `viasd-drafter_feature` beside the others."""
    from viasd.stages.decode import run_decode_stage
    from viasd.stages.train_drafter import run_train_drafter
    from viasd.study.cells import run_inputs, run_policy

    grid = _grid_beside(study, tmp_path, ["ar", "sd", "sd-drafter_feature", "viasd", "viasd-drafter_feature"],
                        study_section={"drafters": ["feature"]})
    from viasd.errors import StudyInputError

    with pytest.raises(StudyInputError, match="no feature drafter at"):
        run_thresholds_stage(grid, progress=False, slims=["main"])
    out, report, record = run_train_drafter(grid, progress=False)
    assert out == grid.model_dir("feature_drafter") and (out / "training.json").exists()
    assert report["steps"] >= 1 and len(report["test_agreement_by_depth"]) == 3
    assert record.metrics["test_agreement.depth_1"] == report["test_agreement_by_depth"][0]
    from viasd.study.paths import router_paths
    from viasd.study.slims import router_drafters, slims_to_tune

    assert router_drafters(grid) == ["model", "feature"] and "drafter_feature" in slims_to_tune(grid)
    routed = run_router_stage(grid, progress=False, drafter="feature")  # refitted on the feature drafter's blocks
    assert routed["drafter"] == "feature" and router_paths(grid, "smoke", "feature")["router"].exists()
    assert router_paths(grid, "smoke", "feature")["router"] != router_paths(grid, "smoke")["router"]
    results = run_thresholds_stage(grid, progress=False, slims=["main", "drafter_feature"])
    main, own = results["main"], results["drafter_feature"]
    assert own["signature"]["drafter"] and own["signature"]["router"] != main["signature"]["router"]
    assert own["oracle"] is not None  # the ceiling on this drafter
    best = main["sd_drafter_feature_best"]
    assert best["gamma"] in grid.thresholds.search["gamma"] and best["fidelity"] == 1.0
    policy = run_policy(grid, "smoke", "stdlib_continuation", "sd-drafter_feature")
    assert (policy.method, policy.drafter, policy.gamma) == ("sd", "feature", best["gamma"])
    on_feature = run_policy(grid, "smoke", "stdlib_continuation", "viasd-drafter_feature")
    assert on_feature.drafter == "feature" and on_feature.gamma == own["gamma"]
    inputs = run_inputs(grid, "smoke", "stdlib_continuation", "viasd-drafter_feature")
    assert inputs["drafter"] == out and inputs["thresholds"].name == "drafter_feature.json"
    summaries = {s["run"]: s for s in run_decode_stage(grid, "smoke", "stdlib_continuation", limit=2, progress=False)}
    assert summaries["sd-drafter_feature"]["fidelity"] == 1.0
    assert summaries["sd-drafter_feature"]["policy"]["drafter"] == "feature"
    assert summaries["viasd-drafter_feature"]["policy"]["drafter"] == "feature"


def test_the_self_drafter_axis_through_the_stages(study, tmp_path):
    """With `sd-drafter_self` and `viasd-drafter_self` in the grid (no training: the target's first
    `models.self_drafter.layers` layers draft), the DIMR slim's search decodes SD with the self-drafter at every
    gamma on dev (lossless) and names its fastest (`sd_drafter_self_best`); `viasd-drafter_self` gets a router
    refitted on the self-drafter's blocks and a search of its own, the DIMR slim (deeper) as its middle tier; the
    decode stage decodes both, `sd-drafter_self` with `ar`'s tokens; the bench takes the same settings."""
    from viasd.stages.decode import run_decode_stage
    from viasd.study.cells import run_policy
    from viasd.study.paths import router_paths
    from viasd.study.slims import router_drafters, slims_to_tune

    grid = _grid_beside(study, tmp_path, ["ar", "sd", "sd-drafter_self", "viasd", "viasd-drafter_self"],
                        models={"self_drafter": {"layers": 1}})
    assert router_drafters(grid) == ["model", "self"] and "drafter_self" in slims_to_tune(grid)
    routed = run_router_stage(grid, progress=False, drafter="self")
    assert routed["drafter"] == "self" and router_paths(grid, "smoke", "self")["router"].exists()
    results = run_thresholds_stage(grid, progress=False, slims=["main", "drafter_self"])
    main, own = results["main"], results["drafter_self"]
    assert own["signature"]["drafter"] == {"self_layers": 1} and own["signature"]["router"] != main["signature"]["router"]
    assert own["oracle"] is not None  # the ceiling on this drafter
    best = main["sd_drafter_self_best"]
    assert best["gamma"] in grid.thresholds.search["gamma"] and best["fidelity"] == 1.0
    assert main["signature"]["sd_drafter_self_best"] == {"self_layers": 1}
    policy = run_policy(grid, "smoke", "stdlib_continuation", "sd-drafter_self")
    assert (policy.method, policy.drafter, policy.gamma) == ("sd", "self", best["gamma"])
    on_self = run_policy(grid, "smoke", "stdlib_continuation", "viasd-drafter_self")
    assert on_self.drafter == "self" and on_self.gamma == own["gamma"]
    summaries = {s["run"]: s for s in run_decode_stage(grid, "smoke", "stdlib_continuation", limit=2, progress=False)}
    assert summaries["sd-drafter_self"]["fidelity"] == 1.0
    assert summaries["sd-drafter_self"]["policy"]["drafter"] == "self"
    assert summaries["viasd-drafter_self"]["policy"]["drafter"] == "self"
    from viasd.bench.command import baseline_settings, load_bench_models

    assert baseline_settings(grid, "smoke", "stdlib_continuation")["sd-drafter_self"] == {"gamma": best["gamma"]}
    _, bench_models = load_bench_models(grid, "smoke", "cpu", "auto")
    assert list(bench_models.self_drafter.mask.keep_layers) == [0] and bench_models.self_router is not None


def test_a_self_drafter_as_deep_as_the_slim_is_one_clear_error(tmp_path):
    """Under VIA-SD the DIMR slim is the middle tier between the self-drafter and the full model: a drafter that
    keeps as many layers as the slim (the smoke target's 4 layers at keep_ratio 0.5: 2), or all of the target's,
    is refused when params.yaml is read; `sd-drafter_self` needs only a drafter shallower than the target."""
    with pytest.raises(config.ConfigError, match="the self-drafter drafts with 2 layers .* the DIMR slim keeps 2"):
        config.load(smoke_params(tmp_path, {"models": {"self_drafter": {"layers": 2}},
                                            "study": {"runs": ["ar", "viasd-drafter_self"]}}))
    with pytest.raises(config.ConfigError, match="models.self_drafter.layers: 4 drafts with 4 of the target's 4"):
        config.load(smoke_params(tmp_path, {"models": {"self_drafter": {"layers": 4}},
                                            "study": {"runs": ["ar", "sd-drafter_self"]}}))
    shared = config.load(smoke_params(tmp_path, {"models": {"self_drafter": {"layers": 0.25}},
                                                 "study": {"runs": ["ar", "sd-drafter_self", "viasd-drafter_self"]}}))
    assert shared.self_drafter.keep_layers(4) == [0] and shared.self_drafter.keep_layers(32) == [0, 1, 2, 3, 4, 5, 6, 7]
    with pytest.raises(config.ConfigError, match="models.self_drafter.layers"):
        config.load(smoke_params(tmp_path, {"models": {"self_drafter": {"layers": 1.5}}}))
