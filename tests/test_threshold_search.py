"""Threshold tuning on the smoke family: every slim's search and its choice re-derived from its trace, the
held-out confirmation, warm starts, a real kill-and-resume, the fidelity bound, MLflow records, and a
clear error for infeasible constraints."""

import json
import math
from statistics import NormalDist

import optuna
import pytest
from search_helpers import complete_trials, kill_after_trials
from study_fixtures import smoke_params

from viasd import config, load_models
from viasd.search.choice import InfeasibleError
from viasd.search.pass_cost import cost_per_token, costs_from_json
from viasd.search.thresholds import POLICY_KEYS
from viasd.stages.dimr_stage import run_dimr_stage
from viasd.stages.router_stage import run_router_stage
from viasd.stages.thresholds_stage import run_thresholds_stage, warm_start_points
from viasd.study.paths import mask_paths, threshold_paths


def test_thresholds_stage_and_infeasible_constraint(study, tmp_path):
    _, params = study
    run_dimr_stage(params, progress=False)
    run_router_stage(params, progress=False)
    results = run_thresholds_stage(params, progress=False)
    # the smoke grid's viasd slims: the DIMR mask, the random mask and the independent model, and the hand
    # rules tuned alone for the DIMR slim (the router ablation)
    assert list(results) == ["rules", "main", "mask_random", "independent"]
    assert results["main"]["signature"]["config"]["routers"] == ["learned"]
    # the rules' own search (full n_trials, run first) competes in main's choice
    main_trace = [json.loads(line) for line in threshold_paths(params, "stdlib_continuation")["trace"].read_text()
                  .splitlines()]
    assert sum(t.get("search") == "rules" for t in main_trace) == results["rules"]["trials"] == 4
    assert {t["router"] for t in main_trace if not t["tiers_off"] and t.get("search") is None} == {"learned"}
    assert results["main"]["trials"] == 4 and results["main"]["signature"]["candidates"]
    assert results["main"]["signature"]["router"]  # the router file's hash: a refitted router is a new search
    for slim in ("mask_random", "independent", "rules"):
        assert results[slim]["signature"]["config"]["routers"] == ["rules"] and results[slim]["router"] == "rules"
    assert results["rules"]["mask"] == results["main"]["mask"] and "same_mask_as" not in results["rules"]
    for slim, result in results.items():
        paths = threshold_paths(params, "stdlib_continuation", slim=slim)
        assert paths["json"].exists() and paths["plot"].exists() and paths["trace"].exists()
        assert result["dev"]["fidelity"] >= 0.5
        assert result["dev"]["task_drop"] is None or result["dev"]["task_drop"] <= 50.0
        check_the_choice(result, [json.loads(line) for line in paths["trace"].read_text().splitlines()])
        if result["tiers_off"]:  # plain SD won: the file says so and decodes as SD
            assert result["tau_accept"] == result["tau_slim"] == "inf" and result["cost_vs_sd"] == 1.0
        else:
            assert result["cost_vs_sd"] <= 1.0  # SD at every gamma was a candidate
        assert result["slim"] == slim and result["signature"]["slim"] == slim
        assert result["cost_vs_sd"] == pytest.approx(result["dev"]["cost_per_token"] / result["sd_same_gamma"]["cost_per_token"])
    masks = mask_paths(params)
    assert results["main"]["mask"] == json.loads(masks["mask"].read_text())["keep_layers"]
    assert results["mask_random"]["mask"] == json.loads(masks["random"].read_text())["keep_layers"]
    assert results["independent"]["mask"] == "independent"
    # one measurement of the per-pass costs (in the first search, the DIMR slim's rules), shared by the other
    # searches ... per runner layout `name:layers` (a full pass and a pass after the shared trunk cost
    # differently), where they cover the slim's layouts
    main_cost = results["rules"]["pass_cost_model"]
    assert {"draft:1", "target:4", "loop:viasd"} <= set(main_cost)  # tiers off: the unshared full model
    assert "pass_cost_model" not in results["rules"]["signature"]
    assert all(r["signature"]["pass_cost_model"] == main_cost for s, r in results.items() if s != "rules")
    del results["rules"]  # the DIMR slim again: what follows compares the slims
    independent = results["independent"]["pass_cost_model"]
    # the 2-layer independent model shares main's costs only if main's slim is an unshared 2-layer pass too
    assert "slim:2" in independent and (independent == main_cost) == ("slim:2" in main_cost)
    for r in results.values():  # the cost model over the best trial's decoding passes, priced by layout and width
        cost, per = r["pass_cost_model"], r["dev"]["pass_widths_per_token"]
        assert {k.rpartition("/")[0] for k in per} <= set(cost)
        assert r["dev"]["cost_per_token"] == pytest.approx(cost_per_token(per, costs_from_json(cost)))
    # the other slims' searches are shorter (thresholds.ablation_trials), start from the main search's
    # cheapest feasible tiered policies, and reuse its tiers-off (SD) points instead of decoding them again
    assert results["main"]["trials"] == 4 and results["mask_random"]["trials"] == 3
    traces = {slim: [json.loads(line) for line in threshold_paths(params, "stdlib_continuation", slim=slim)["trace"]
                     .read_text().splitlines()] for slim in results}
    sd_points = {slim: [t for t in trace if t["tiers_off"]] for slim, trace in traces.items()}
    assert [(p["gamma"], p["seconds"]) for p in sd_points["mask_random"]] == \
        [(p["gamma"], p["seconds"]) for p in sd_points["main"]]
    warm = warm_start_points(params, "smoke", "stdlib_continuation")
    assert warm  # the smoke constraints leave tiered trials feasible
    first = min((t for t in traces["mask_random"] if not t["tiers_off"]), key=lambda t: t["number"])
    assert {k: first[k] for k in POLICY_KEYS} == {k: warm[0][k] for k in POLICY_KEYS}
    again = run_thresholds_stage(params, progress=False)  # no-op re-run
    del again["rules"]
    assert again == {slim: {**r, "up_to_date": True} for slim, r in results.items()}
    # a change to the learned router's space alone leaves the searches that draw only the hand rules up to date
    moved = config.load(smoke_params(tmp_path, {"data": {"dir": str(params.data.dir)},
                                                "models": {"dir": str(params.models_dir)},
                                                "thresholds": {"tau_router": [0.5, 0.95]}}))
    assert moved.thresholds.search["tau_router"] != params.thresholds.search["tau_router"]
    kept = run_thresholds_stage(moved, progress=False, slims=["rules", "mask_random", "independent"])
    assert list(kept) == ["rules", "mask_random", "independent"] and all(r["up_to_date"] for r in kept.values())


def test_generate_decodes_a_study_cell_as_the_study_does(study, capsys):
    """`viasd generate --pair P --task T --run viasd` decodes with the cell's policy (its tuned thresholds,
    slim and learned router, the task's stop strings): on the decode stage's prompts it writes the decode
    stage's tokens; a policy flag overrides that field alone."""
    from viasd.cli import main
    from viasd.stages.decode_stage import run_decode_stage
    from viasd.study.paths import decode_paths
    from viasd.tasks import load_examples

    src, params = study
    run_dimr_stage(params, progress=False)
    run_router_stage(params, progress=False)
    run_thresholds_stage(params, progress=False)  # a no-op after the stage test
    tuned = json.loads(threshold_paths(params, "stdlib_continuation")["json"].read_text())
    run_decode_stage(params, "smoke", "stdlib_continuation", ["viasd"], limit=2, progress=False)
    rows = [json.loads(line) for line in decode_paths(params, "smoke", "stdlib_continuation", "viasd")["rows"]
            .read_text().splitlines()]
    cell = ["generate", "--params", str(src / "params.yaml"), "--pair", "smoke", "--task", "stdlib_continuation",
            "--run", "viasd", "--json"]
    examples = load_examples(params.data.dir, "stdlib_continuation", params.decode.split)[:2]
    for example, row in zip(examples, rows, strict=True):
        assert main([*cell, "--prompt", example.prompt]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["token_ids"] == row["token_ids"] and out["stats"]["method"] == "viasd"
    assert {k: out["policy"][k] for k in POLICY_KEYS} == {k: tuned[k] for k in POLICY_KEYS}
    assert out["policy"]["max_new_tokens"] == params.max_new_tokens("stdlib_continuation")
    other = 5 if tuned["gamma"] != 5 else 4  # a gamma the search did not choose
    assert main([*cell, "--gamma", str(other), "--prompt", examples[0].prompt]) == 0
    changed = json.loads(capsys.readouterr().out)["policy"]
    assert changed == {**out["policy"], "gamma": other}


def check_the_choice(result: dict, trace: list[dict]) -> None:
    """The result is what the selection rule picks from its trace: the cheapest feasible tiered trial that
    passed the held-out confirmation, every cheaper feasible one checked and rejected first; or the
    cheapest feasible SD point when no tiered trial saved `min_gain` or passed. A tiered trial is a candidate
    only if its dev fidelity's lower confidence bound (recorded in the trace) meets the floor."""
    floor = result["signature"]["config"]["quality"]["min_fidelity"]
    z = NormalDist().inv_cdf(result["signature"]["config"]["fidelity_confidence"])
    for t in trace:
        if t["fidelity"] is not None:
            assert t["fidelity_lower_bound"] == pytest.approx(t["fidelity"] - z * (t["fidelity_se"] or 0.0))
    feasible = [t for t in trace if t["feasible"] and (t["tiers_off"] or t["fidelity_lower_bound"] >= floor)]
    sd_best = min((t for t in feasible if t["tiers_off"]), key=lambda t: t["cost_per_token"])
    checks = result["confirm"]["checks"]
    if result["tiers_off"]:
        assert result["gamma"] == sd_best["gamma"]
        assert result["dev"]["cost_per_token"] == pytest.approx(sd_best["cost_per_token"])
        assert all(not c["feasible"] for c in checks)
        return
    kept = checks[-1]
    assert kept["feasible"] and not any(c["feasible"] for c in checks[:-1])
    chosen = next(t for t in feasible if (t["number"], t.get("search")) == (kept["number"], kept["search"]))
    assert {k: result[k] for k in POLICY_KEYS} == {k: chosen[k] for k in POLICY_KEYS}
    assert result["dev"]["cost_per_token"] == pytest.approx(chosen["cost_per_token"])
    cheaper = [t for t in feasible if not t["tiers_off"] and t["cost_per_token"] < chosen["cost_per_token"]]
    assert sorted((t["number"], t.get("search")) for t in cheaper) == \
        sorted((c["number"], c["search"]) for c in checks[:-1])
    assert chosen["cost_per_token"] <= (1 - result["signature"]["config"]["min_gain"]) * sd_best["cost_per_token"]


def test_a_baseline_mask_equal_to_the_dimr_mask_takes_its_thresholds(study, monkeypatch):
    """`truncate` is often the DIMR mask itself (a LayerSkip-trained target): its search would tune the
    same slim again, so it takes the main result, marked, with no search of its own."""
    from viasd.stages import thresholds_stage
    from viasd.study.slims import slim_description

    _, params = study
    run_dimr_stage(params, progress=False)
    main = run_thresholds_stage(params, progress=False, slims=["main"])["main"]
    real = slim_description
    monkeypatch.setattr(thresholds_stage, "slim_description",
                        lambda p, pair, spec: main["mask"] if spec.ablation == "mask_every_other" else real(p, pair, spec))
    paths = threshold_paths(params, "stdlib_continuation", slim="mask_every_other")
    try:
        out = run_thresholds_stage(params, progress=False, slims=["main", "mask_every_other"])["mask_every_other"]
        assert out["same_mask_as"] == "main" and out["slim"] == "mask_every_other" and "up_to_date" not in out
        assert {k: out[k] for k in POLICY_KEYS} == {k: main[k] for k in POLICY_KEYS}
        assert json.loads(paths["json"].read_text()) == out and paths["trace"].exists()
        assert not paths["storage"].exists()  # no search of its own
        again = run_thresholds_stage(params, progress=False, slims=["main", "mask_every_other"])["mask_every_other"]
        assert again == {**out, "up_to_date": True}
    finally:
        for key in ("json", "trace", "plot"):
            paths[key].unlink(missing_ok=True)


def test_infeasible_constraint_names_it_and_writes_nothing(study, tmp_path):
    """Agreement is made impossible by scoring against a reference of an id no model can emit, so
    no candidate, not even tiers off, can be feasible; the error names the constraint."""
    from viasd.metrics.quality import QualityConstraints
    from viasd.search.thresholds import DevSet, ThresholdConfig, tune_thresholds
    from viasd.tasks import load_examples

    _, params = study
    run_dimr_stage(params, progress=False)
    models = load_models(params.model_dir("target"), draft=params.model_dir("draft"),
                         masks=[mask_paths(params)["mask"]], device="cpu")
    dev = DevSet(models, load_examples(params.data.dir, "stdlib_continuation", "dev")[:2], 8)
    dev.reference = [[models.vocab_size] * len(ref) for ref in dev.reference]
    cfg = ThresholdConfig(n_trials=3, gamma=(2, 4), quality=QualityConstraints(min_fidelity=0.5, max_task_drop=None,
                                                                               min_agreement=0.5))
    storage = tmp_path / "t.db"
    with pytest.raises(InfeasibleError, match=r"no thresholds met the quality constraints \(fidelity >= 0.5 and "
                                              r"agreement >= 0.5\), not even tiers off .* over 5 candidates"):
        tune_thresholds(dev, cfg, f"sqlite:///{storage}", "t", progress=False)


def test_search_commands_are_recorded_in_mlflow(study, tmp_path, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    from viasd.cli import main

    src, params = study
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for path in mask_paths(params).values():
        if path.suffix in (".json", ".db"):
            path.unlink(missing_ok=True)
    assert main(["dimr-search", "--params", str(src / "params.yaml")]) == 0
    assert main(["dimr-search", "--params", str(src / "params.yaml")]) == 0  # no-op: no second run
    capsys.readouterr()
    client = MlflowClient(uri)
    found = client.search_runs([client.get_experiment_by_name("viasd-smoke").experiment_id], max_results=1000)
    runs = [r for r in found if r.data.tags.get("stage") != "trial"]
    assert len(runs) == 1
    run = runs[0]
    trials = [r for r in found if r.data.tags.get("stage") == "trial"]  # each Optuna trial, a nested run
    assert len(trials) == 8 and {r.data.tags["mlflow.parentRunId"] for r in trials} == {run.info.run_id}
    assert all("keep_layers" in r.data.params and "cost" in r.data.metrics for r in trials)
    assert run.data.tags["stage"] == "dimr_search" and run.data.tags["pair"] == "smoke"
    assert run.data.metrics["cost"] <= run.data.metrics["best_random_cost"]
    assert run.data.params["cost"] == "path" and run.data.params["n_random"] == "4"
    assert len(client.get_metric_history(run.info.run_id, "trial_cost")) == 8
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"mask.json", "search.png", "random.json"} <= artifacts


def test_killed_threshold_search_resumes(study, tmp_path):
    _, params = study
    run_dimr_stage(params, progress=False)
    override = {"data": {"dir": str(params.data.dir)}, "models": {"dir": str(params.models_dir)},
                "thresholds": {"n_trials": 14, "task": "humaneval"}}
    path = smoke_params(tmp_path, override)
    resumed = config.load(path)
    paths = threshold_paths(resumed, "humaneval")
    for key in ("json", "storage"):
        paths[key].unlink(missing_ok=True)
    kill_after_trials(["tune-thresholds", "--params", str(path), "--no-track", "--slim", "main"], paths["storage"], 3)
    storage = f"sqlite:///{paths['storage']}"
    before = {t.number: t.params for t in complete_trials(storage, "thresholds-smoke-humaneval-main")}
    assert 3 <= len(before) < 14 and not paths["json"].exists()
    killed_costs = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage).user_attrs[
        "pass_cost_model"]
    result = run_thresholds_stage(resumed, progress=False, slims=["main"])["main"]
    after = complete_trials(storage, "thresholds-smoke-humaneval-main")
    # a trial the kill interrupted is marked failed by the resumed (serial) search, not left running
    states = {t.state for t in optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage).trials}
    assert optuna.trial.TrialState.RUNNING not in states
    # the resumed search costs its trials with the per-pass costs the killed one measured
    assert result["pass_cost_model"] == killed_costs
    costs = costs_from_json(killed_costs)
    for t in after:  # per runner layout and width
        assert t.value == pytest.approx(cost_per_token(t.user_attrs["pass_widths_per_token"], costs))
    assert len(after) == result["trials"] == 14
    assert all(t.params == before[t.number] for t in after if t.number in before)


def test_a_trial_stops_once_the_fidelity_floor_is_out_of_reach(study):
    """The early stop is exact: it fires only when even all-correct remaining prompts could not lift the
    fidelity to the floor, and the full decode of such a policy is indeed below the floor."""
    from dataclasses import replace

    from viasd.search.thresholds import DevSet
    from viasd.tasks import load_examples

    _, params = study
    run_dimr_stage(params, progress=False)
    models = load_models(params.model_dir("target"), draft=params.model_dir("draft"),
                         masks=[mask_paths(params)["mask"]], device="cpu")
    dev = DevSet(models, load_examples(params.data.dir, "stdlib_continuation", "dev")[:6], 16)
    dev.measure_pass_cost()
    n = len(dev.prompts)
    assert n >= 3
    # every draft token accepted at once: as lossy as VIA-SD gets
    lossy = replace(dev.base, gamma=4, score="ratio", tau_accept=1e-6, tau_slim=0.0, max_lag=0)
    full = dev.evaluate(lossy)
    assert not full["pruned"] and full["prompts"] == n and full["fidelity"] < 0.99
    floor = (1 + full["fidelity"]) / 2  # out of reach, but not from the first prompt on
    stopped = dev.evaluate(lossy, min_fidelity=floor)
    k = stopped["prompts"]
    assert stopped["pruned"] and k < n and stopped["task_drop"] is None and stopped["fidelity"] < floor
    # exact: after k prompts the bound was below the floor, after fewer it was not
    from viasd.metrics.model_metrics import score_outputs

    rows = [score_outputs(models.target, [p], [models.generate(p, lossy).token_ids], models.vocab_size)[1][0]
            for p in dev.prompts]

    def bound(j):
        matched = sum(r["fidelity"] * r["tokens"] for r in rows[:j] if r)
        tokens = sum(r["tokens"] for r in rows[:j] if r)
        rest = (n - j) * 16
        return (matched + rest) / (tokens + rest)

    assert bound(k) < floor and all(bound(j) >= floor for j in range(1, k))
    lossless = dev.evaluate(replace(dev.base, gamma=4, tau_accept=math.inf, tau_slim=math.inf), min_fidelity=0.999)
    assert not lossless["pruned"] and lossless["fidelity"] == 1.0 and lossless["prompts"] == n


def test_the_choice_is_confirmed_on_held_out_dev_prompts(study, tmp_path):
    """The cheapest feasible tiered trial is kept only if it meets the constraints again on prompts the
    search did not select on. Confirmed on the search's own prompts (the same decodes) it is kept at the
    first check; on prompts where no tiered policy can meet the agreement floor (a reference no model
    emits) every candidate is rejected, `confirm_candidates` of them at most, cheapest first, and SD wins."""
    from dataclasses import replace

    from viasd.metrics.quality import QualityConstraints
    from viasd.search.thresholds import DevSet, ThresholdConfig, tune_thresholds
    from viasd.tasks import load_examples

    _, params = study
    run_dimr_stage(params, progress=False)
    models = load_models(params.model_dir("target"), draft=params.model_dir("draft"),
                         masks=[mask_paths(params)["mask"]], device="cpu")
    examples = load_examples(params.data.dir, "stdlib_continuation", "dev")[:2]
    # tier 1 accepts almost every draft token (no draft gate, no lag): tiered trials skip most full passes
    cfg = ThresholdConfig(n_trials=6, gamma=(2, 4), min_gain=0.0, confirm_candidates=2, scores=("ratio",),
                          tau_accept=(1e-3, 1e-2), gate=(0.0, 0.0), max_lag=(0,),
                          quality=QualityConstraints(min_fidelity=0.0, max_task_drop=None, min_agreement=0.0))
    dev = DevSet(models, examples, 8)
    same = DevSet(models, examples, 8)
    kept = tune_thresholds(dev, cfg, f"sqlite:///{tmp_path / 'a.db'}", "t", progress=False, confirm=same)
    assert not kept["best"]["tiers_off"]  # loose tier 1: a tiered trial is cheaper than SD
    (check,) = kept["confirm"]
    assert check["feasible"] and check["number"] == kept["best"]["number"]
    assert check["fidelity"] == kept["best"]["fidelity"] and check["agreement"] == kept["best"]["agreement"]

    strict = replace(cfg, quality=QualityConstraints(min_fidelity=0.0, max_task_drop=None, min_agreement=0.5))
    unreachable = DevSet(models, examples, 8)
    unreachable.reference = [[models.vocab_size] * len(ref) for ref in unreachable.reference]
    out = tune_thresholds(dev, strict, f"sqlite:///{tmp_path / 'a.db'}", "t", progress=False, confirm=unreachable)
    assert out["best"]["tiers_off"]
    ranked = sorted((t for t in out["trials"] if t["feasible"] and not t["tiers_off"]),
                    key=lambda t: (t["cost_per_token"], t["number"]))
    assert len(ranked) >= 2 and [c["number"] for c in out["confirm"]] == [t["number"] for t in ranked[:2]]
    assert all(not c["feasible"] and c["violations"]["agreement"] > 0 for c in out["confirm"])


def test_a_trial_that_met_the_fidelity_floor_by_chance_is_no_candidate():
    """A tiered trial whose dev fidelity meets the floor only as a point estimate, its lower confidence bound
    (f - 1.645 SE at 0.95) below it, is not chosen: the next cheapest that meets it with confidence is, and
    with none, SD. At confidence 0.5 (the point estimate) the cheapest feasible trial is chosen."""
    from dataclasses import replace

    from viasd.metrics.quality import QualityConstraints
    from viasd.search.choice import choose
    from viasd.search.thresholds import ThresholdConfig

    cfg = ThresholdConfig(min_gain=0.03, quality=QualityConstraints(min_fidelity=0.95, max_task_drop=None))

    def point(number, cost, fidelity, se, tiers_off=False):
        measured = {"fidelity": fidelity, "fidelity_se": se, "task_drop": None}
        return {"number": number, "tiers_off": tiers_off, "cost_per_token": cost, **measured,
                "violations": cfg.quality.violations(measured), "feasible": not cfg.quality.violations(measured)}

    sd = point(None, 1.0, 1.0, 0.0, tiers_off=True)
    lucky = point(1, 0.5, 0.96, 0.02)  # bound 0.927
    sure = point(2, 0.7, 0.99, 0.01)  # bound 0.974
    under = point(3, 0.4, 0.94, 0.001)  # infeasible
    best, checks = choose([sd, lucky, sure, under], cfg)
    assert best is sure and checks == []
    assert lucky["fidelity_lower_bound"] == pytest.approx(0.96 - NormalDist().inv_cdf(0.95) * 0.02)
    assert sd["fidelity_lower_bound"] == 1.0
    assert choose([sd, lucky, sure, under], replace(cfg, fidelity_confidence=0.5))[0] is lucky
    assert choose([sd, lucky, under], cfg)[0] is sd
    # a bound met at 0.95 can be missed at 0.99: SD
    assert choose([sd, point(4, 0.5, 0.97, 0.009)], cfg)[0]["number"] == 4
    assert choose([sd, point(4, 0.5, 0.97, 0.009)], replace(cfg, fidelity_confidence=0.99))[0] is sd


def test_the_held_out_check_asks_the_fidelity_floor_with_confidence():
    """A candidate whose held-out fidelity meets the floor only as a point estimate (0.955 with SE 0.008: bound
    0.942) is rejected at the held-out check, the next one (0.975, SE 0.005: bound 0.967) is kept; the checks
    record each bound and its shortfall; at confidence 0.5 the first is kept; a task drop over the bar still
    rejects a candidate whose fidelity holds."""
    from dataclasses import replace

    from viasd.decoding.policy import TUNED_FIELDS, DecodePolicy
    from viasd.metrics.quality import QualityConstraints
    from viasd.search.choice import confirm_choice
    from viasd.search.thresholds import ThresholdConfig

    cfg = ThresholdConfig(quality=QualityConstraints(min_fidelity=0.95, max_task_drop=1.0, min_agreement=None))
    held_out = {0.5: (0.955, 0.008, 0.2), 0.6: (0.975, 0.005, 0.3), 0.7: (0.99, 0.001, 1.5)}

    class HeldOut:  # a DevSet on 48 held-out prompts: `evaluate` gives each candidate's figures, by its tau_accept
        base, prompts = DecodePolicy(), [None] * 48

        def evaluate(self, policy, min_fidelity=None):
            fidelity, se, drop = held_out[policy.tau_accept]
            return {"fidelity": fidelity, "fidelity_se": se, "groups": 19, "nll": 1.0, "task_score": 10.0 - drop,
                    "task_score_ar": 10.0, "task_drop": drop, "agreement": 0.5, "prompts": 48, "pruned": False,
                    "wall_per_token": 0.01}

    confirm = HeldOut()
    ranked = [{**{k: getattr(confirm.base, k) for k in TUNED_FIELDS}, "number": n, "cost_per_token": 0.5 + n,
               "tau_accept": tau} for n, tau in enumerate(held_out)]
    kept, checks = confirm_choice(ranked, confirm, cfg)
    assert kept is ranked[1] and [c["feasible"] for c in checks] == [False, True]
    z = NormalDist().inv_cdf(0.95)
    assert checks[0]["fidelity_lower_bound"] == pytest.approx(0.955 - z * 0.008)
    assert checks[0]["violations"] == {"fidelity_lower_bound": pytest.approx(0.95 - (0.955 - z * 0.008))}
    assert checks[1]["fidelity_lower_bound"] == pytest.approx(0.975 - z * 0.005) and checks[1]["violations"] == {}
    kept, checks = confirm_choice(ranked, confirm, replace(cfg, fidelity_confidence=0.5))
    assert kept is ranked[0] and len(checks) == 1
    kept, checks = confirm_choice(ranked[2:], confirm, cfg)
    assert kept is None and set(checks[0]["violations"]) == {"task_drop"}


def test_fidelity_standard_error_over_prompts():
    """The ratio estimator's standard error: with equal token counts it is the standard error of the mean
    of the per-prompt fidelities; a prompt's weight grows with its tokens; None below two outputs."""
    from statistics import stdev

    from viasd.metrics.model_metrics import fidelity_standard_error

    per_prompt = [1.0, 0.75, 0.5, 0.875]
    scores = [{"fidelity": f, "tokens": 8, "nll": 1.0} for f in per_prompt]
    assert fidelity_standard_error(scores) == pytest.approx(stdev(per_prompt) / math.sqrt(len(per_prompt)))
    # f = 15/20; residuals m_i - f n_i = 2.5 and -2.5: SE = sqrt(2 * 12.5) / 20
    assert fidelity_standard_error([{"fidelity": 1.0, "tokens": 10}, {"fidelity": 0.5, "tokens": 10}]) == 0.25
    # f = 11/12; residuals 1 - 11/12 * 2 = -5/6 and 10 - 11/12 * 10 = 5/6: SE = sqrt(2 * 50/36) / 12
    assert fidelity_standard_error([{"fidelity": 0.5, "tokens": 2}, {"fidelity": 1.0, "tokens": 10}]) == \
        pytest.approx(math.sqrt(2 * 50 / 36) / 12)
    assert fidelity_standard_error([{"fidelity": 0.5, "tokens": 8}, None, {"fidelity": 0.5, "tokens": 0}]) is None
    assert fidelity_standard_error([{"fidelity": 0.5, "tokens": 8}, {"fidelity": 0.5, "tokens": 4}]) == 0.0


def test_fidelity_standard_error_clusters_by_source_file():
    """Outputs of one group (cuts of one source file) pool into one unit: two files whose cuts all agree with
    each other give the SE of two units, not of four; each output its own group is the default."""
    from viasd.metrics.model_metrics import fidelity_standard_error

    scores = [{"fidelity": f, "tokens": 10} for f in (1.0, 1.0, 0.5, 0.5)]
    per_output = fidelity_standard_error(scores)
    by_file = fidelity_standard_error(scores, ["a.py", "a.py", "b.py", "b.py"])
    # files: M = 20 and 10 of N = 20 each, f = 0.75, residuals +5 and -5: SE = sqrt(2 * 50) / 40
    assert by_file == pytest.approx(math.sqrt(2 * 50) / 40) and by_file > per_output
    assert fidelity_standard_error(scores, [0, 1, 2, 3]) == per_output
    # files that mix good and bad cuts alike: no spread between files
    assert fidelity_standard_error(scores, ["a.py", "b.py", "a.py", "b.py"]) == 0.0
    assert fidelity_standard_error(scores, ["a.py"] * 4) is None  # one file: no spread to estimate
    with pytest.raises(ValueError):
        fidelity_standard_error(scores, ["a.py"])


def test_the_search_and_held_out_prompts_come_from_disjoint_files():
    """`split_by_group`: the two sides share no group, keep the given order, and the cut is the one nearest
    the share n / (n + k) of the groups that leaves both sides enough; no such cut is one clear error."""
    from viasd.tasks.base import Example, TaskError, source_file, split_by_group

    # 6 files in hash order, cut round after round (as stdlib_continuation builds them): 3 cuts of the first
    # 3 files, 2 of the others
    examples = [Example(id=f"f{i}.py:{r * 10 + 1}", prompt="", reference="") for r in range(3) for i in range(6)
                if r < 2 or i < 3]
    search, held = split_by_group(examples, 4, 8, source_file)
    assert {source_file(e) for e in search} == {"f0.py", "f1.py"}  # share 2 of 6 files; their cuts, in order
    assert [e.id for e in search] == ["f0.py:1", "f1.py:1", "f0.py:11", "f1.py:11"]
    assert len(held) == 8 and {source_file(e) for e in held} == {"f2.py", "f3.py", "f4.py", "f5.py"}
    # 8 search prompts need 3 files (9 cuts); the 6 left hold 6 held-out prompts
    search, held = split_by_group(examples, 8, 6, source_file)
    assert len(search) == 8 and len(held) == 6 and not {source_file(e) for e in search} & {source_file(e) for e in held}
    with pytest.raises(TaskError, match="disjoint groups"):
        split_by_group(examples, 8, 8, source_file)
    # ungrouped examples (each its own group) split in order; no held-out set takes the first n
    plain = [Example(id=str(i), prompt="", reference="") for i in range(6)]
    assert [e.id for e in split_by_group(plain, 2, 3, lambda e: e.id)[1]] == ["2", "3", "4"]
    assert split_by_group(plain, 4, 0, lambda e: e.id) == (plain[:4], [])


@pytest.mark.parametrize("routers", [("rules",), ("learned",), ("rules", "learned")])
def test_a_search_depends_only_on_the_space_of_its_routers(routers):
    """`searched_space` (a search's signature and Optuna study name) drops the fields of a router the search
    does not draw: moving the learned router's `tau_router` leaves a hand-rules search up to date, moving the
    rules' `tau_slim` a learned one, and a search of both depends on both. The dropped fields are exactly the
    ones `suggest_policy` never draws for those routers (its Optuna parameter names over many trials)."""
    from dataclasses import replace

    from viasd.decoding.policy import DecodePolicy
    from viasd.search.thresholds import ROUTER_FIELDS, ThresholdConfig, searched_space, suggest_policy

    cfg = ThresholdConfig(routers=routers)
    assert (searched_space(replace(cfg, tau_router=(0.5, 0.9))) == searched_space(cfg)) == ("learned" not in routers)
    assert (searched_space(replace(cfg, tau_slim=(0.5, 0.9))) == searched_space(cfg)) == ("rules" not in routers)
    assert searched_space(replace(cfg, gamma=(2,))) != searched_space(cfg)
    # each field's Optuna parameters, as suggest_policy names them
    names = {"tau_accept": {"tau_accept_ratio"}, "tau_accept_prob": {"tau_accept_prob"}, "tau_slim": {"tau_slim"},
             "scores": {"score"}, "confidences": {"confidence"}, "tau_router": {"tau_router_accept", "tau_router_slim"}}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    drawn = set()
    for _ in range(40):
        trial = study.ask()
        suggest_policy(trial, DecodePolicy(), cfg)
        drawn |= set(trial.params)
        study.tell(trial, 1.0)
    for router, fields in ROUTER_FIELDS.items():
        params = set().union(*(names[f] for f in fields))
        assert (params <= drawn) == (router in routers) and (not params & drawn) == (router not in routers)
        assert all((f in searched_space(cfg)) == (router in routers) for f in fields)
