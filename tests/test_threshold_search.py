"""Threshold tuning on the smoke family: every slim's search and its choice re-derived from its trace, the
held-out confirmation, warm starts, a real kill-and-resume, the fidelity bound, MLflow records, and a
clear error for infeasible constraints."""

import json
import math

import optuna
import pytest
from search_helpers import check_the_choice, complete_trials, kill_after_trials
from study_fixtures import smoke_params

from viasd import config, load_models
from viasd.decoding.tier_router import headroom_share
from viasd.errors import ViasdError
from viasd.search.choice import InfeasibleError
from viasd.search.pass_cost import cost_per_token, costs_from_json
from viasd.search.thresholds import POLICY_KEYS
from viasd.stages.dimr_search import run_dimr_stage
from viasd.stages.train_router import run_router_stage
from viasd.stages.tune_thresholds import run_thresholds_stage, warm_start_points
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
    # the DIMR slim's search has the oracle's ceiling at fidelity 1 and the budgeted oracle's at the fidelity
    # floor (smoke: 0.5), at the plain oracle's cheapest gamma; the others have neither
    oracle, at_floor = results["main"]["oracle"], results["main"]["oracle_at_floor"]
    assert oracle["fidelity"] == 1.0 and "oracle_budget" not in oracle
    assert at_floor["oracle_budget"] == pytest.approx(0.5) and at_floor["gamma"] == oracle["gamma"]
    assert at_floor["fidelity"] >= 0.5
    # the shares of each ceiling's headroom over the cheapest SD point that the choice takes, from the costs
    sd_cost = oracle["sd_over_oracle_cost"] * oracle["cost_per_token"]
    assert at_floor["sd_over_oracle_cost"] * at_floor["cost_per_token"] == pytest.approx(sd_cost)
    for key, ceiling in (("headroom_taken", oracle), ("headroom_taken_at_floor", at_floor)):
        share = headroom_share(sd_cost / results["main"]["dev"]["cost_per_token"], ceiling["sd_over_oracle_cost"])
        assert results["main"][key] == (None if share is None else pytest.approx(share))
    assert all(results[s]["oracle_at_floor"] is None for s in ("rules", "mask_random", "independent"))
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
        # SD at its own best gamma: the cheapest tiers-off point of the trace, the gamma sd and cascade_sd decode at
        trace = [json.loads(line) for line in paths["trace"].read_text().splitlines()]
        cheapest = min((t for t in trace if t["tiers_off"]), key=lambda t: t["cost_per_token"])
        assert result["sd_best"]["gamma"] == cheapest["gamma"]
        assert result["sd_best"]["cost_per_token"] == pytest.approx(cheapest["cost_per_token"])
        assert result["sd_best"]["cost_per_token"] <= result["sd_same_gamma"]["cost_per_token"] + 1e-12
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
        assert r["dev"]["cost_model_per_token"] == pytest.approx(cost_per_token(per, costs_from_json(cost)))
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


def test_generate_decodes_a_study_cell_as_the_study_does(study, capsys, tmp_path):
    """`viasd generate --pair P --task T --run viasd` decodes with the cell's policy (its tuned thresholds,
    slim and learned router, the task's stop strings): on the decode stage's prompts it writes the decode
    stage's tokens; a policy flag overrides that field alone."""
    from viasd.cli import main
    from viasd.stages.decode import run_decode_stage
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
    # the same cell from Python (the README's `load_study_run`): the same policy, the decode stage's tokens
    from viasd import load_study_run

    models, policy = load_study_run(src, task="stdlib_continuation", run="viasd")
    assert json.loads(json.dumps(policy.as_record())) == out["policy"]
    assert models.generate(examples[-1].prompt, policy).token_ids == rows[-1]["token_ids"]
    with pytest.raises(ViasdError, match="task 'nope' is not a task of the study"):
        load_study_run(src, task="nope")
    # and from transformers' generate, with the study's slim, router, thresholds and draft (`viasd.hf`)
    import torch

    import viasd.hf

    for example, row in zip(examples, rows, strict=True):
        ids = torch.tensor([models.encode(example.prompt)])
        hf = models.target.generate(ids, custom_generate=viasd.hf.generate, viasd_study=src, task="stdlib_continuation",
                                    run="viasd", tokenizer=models.tokenizer, max_new_tokens=policy.max_new_tokens,
                                    do_sample=False, return_dict_in_generate=True)
        assert hf.sequences[0, ids.shape[1]:].tolist() == row["token_ids"] and hf.viasd_stats[0].method == "viasd"
    # and as the registered MLflow model of the pair (what the report stage logs), loaded by name
    import mlflow
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from viasd.study.registered_model import log_pair_model, registered_name

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(store)
    run_id = client.create_run(client.create_experiment("models", artifact_location=str(tmp_path / "art"))).info.run_id
    uri = log_pair_model(params, "smoke", run_id, store)
    assert uri == f"models:/{registered_name(params, 'smoke')}/1"
    mlflow.set_tracking_uri(store)
    loaded = mlflow.pyfunc.load_model(f"models:/{registered_name(params, 'smoke')}/latest")
    decoded = loaded.predict(pd.DataFrame({"prompt": [e.prompt for e in examples], "task": "stdlib_continuation"}))
    assert [list(ids) for ids in decoded["token_ids"]] == [row["token_ids"] for row in rows]
    assert decoded["acceptance_rate"].notna().all()
    other = 5 if tuned["gamma"] != 5 else 4  # a gamma the search did not choose
    assert main([*cell, "--gamma", str(other), "--prompt", examples[0].prompt]) == 0
    changed = json.loads(capsys.readouterr().out)["policy"]
    assert changed == {**out["policy"], "gamma": other}
    # the oracle run decodes in the balanced order with ar and the other runs, peeking for itself (its peeks timed
    # apart, outside its wall time); fidelity 1 all the same
    oracle = run_decode_stage(params, "smoke", "stdlib_continuation", ["viasd-oracle"], limit=2, progress=False)[0]
    assert oracle["peek_from_reference"] == 0 and oracle["peek_passes"] > 0 and oracle["peek_time_s"] > 0
    assert oracle["fidelity"] == 1.0
    # the budgeted oracle at the fidelity floor (smoke: 0.5): wrong tokens within its budget, peeks apart
    budgeted = run_decode_stage(params, "smoke", "stdlib_continuation", ["viasd-oracle_budget"], limit=2,
                                progress=False)[0]
    assert budgeted["policy"]["oracle_budget"] == pytest.approx(0.5) and budgeted["policy"]["router"] == "oracle"
    assert budgeted["fidelity"] >= 0.5 and budgeted["peek_passes"] > 0


def test_a_baseline_mask_equal_to_the_dimr_mask_takes_its_thresholds(study, monkeypatch):
    """`truncate` is often the DIMR mask itself (a LayerSkip-trained target): its search would tune the
    same slim again, so it takes the main result, marked, with no search of its own."""
    from viasd.stages import tune_thresholds as thresholds_stage
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
    from viasd.search.dev_set import DevSet
    from viasd.search.thresholds import ThresholdConfig, tune_thresholds
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

    from viasd.search.dev_set import DevSet
    from viasd.tasks import load_examples

    _, params = study
    run_dimr_stage(params, progress=False)
    models = load_models(params.model_dir("target"), draft=params.model_dir("draft"),
                         masks=[mask_paths(params)["mask"]], device="cpu")
    from viasd.metrics.model_metrics import score_outputs

    examples = load_examples(params.data.dir, "stdlib_continuation", "dev")[:6]
    dev = DevSet(models, examples, 16)
    # every draft token accepted at once: as lossy as VIA-SD gets
    lossy = replace(dev.base, gamma=4, score="ratio", tau_accept=1e-6, tau_slim=0.0, max_lag=0)
    # the prompts the lossy policy gets most wrong first, so that the floor can go out of reach before the last one
    first = [score_outputs(models.target, [p], [models.generate(p, lossy).token_ids], models.vocab_size)[1][0]
             for p in dev.prompts]
    order = sorted(range(len(examples)), key=lambda i: first[i]["fidelity"] if first[i] else 1.0)
    dev = DevSet(models, [examples[i] for i in order], 16)
    dev.measure_pass_cost()
    n = len(dev.prompts)
    assert n >= 3
    full = dev.evaluate(lossy)
    assert not full["pruned"] and full["prompts"] == n and full["fidelity"] < 0.99

    rows = [score_outputs(models.target, [p], [models.generate(p, lossy).token_ids], models.vocab_size)[1][0]
            for p in dev.prompts]

    def bound(j):  # the best fidelity still reachable after j prompts: every remaining token right
        matched = sum(r["fidelity"] * r["tokens"] for r in rows[:j] if r)
        tokens = sum(r["tokens"] for r in rows[:j] if r)
        rest = (n - j) * 16
        return (matched + rest) / (tokens + rest)

    # a floor that goes out of reach before the last prompt (which prompt depends on the data: the lowest bound)
    floor = min(bound(j) for j in range(1, n)) + 1e-9
    assert floor > full["fidelity"] and floor < 1
    stopped = dev.evaluate(lossy, min_fidelity=floor)
    k = stopped["prompts"]
    assert stopped["pruned"] and k < n and stopped["task_drop"] is None and stopped["fidelity"] < floor
    # exact: after k prompts the bound was below the floor, after fewer it was not
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
    from viasd.search.dev_set import DevSet
    from viasd.search.thresholds import ThresholdConfig, tune_thresholds
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


def test_a_batched_dev_set_measures_what_the_one_at_a_time_one_does(study):
    """`thresholds.batch_size`: the dev decodes in batches give every trial the same tokens, quality and modelled cost
    as one prompt at a time (rows decode as they do alone); the wall times come from the first `wall_prompts`
    prompts, decoded alone, and say so (`timed_prompts`). The oracle, which peeks at the references, batches too."""
    from dataclasses import replace

    from viasd.search.dev_set import DevSet
    from viasd.tasks import load_examples

    _, params = study
    run_dimr_stage(params, progress=False)
    models = load_models(params.model_dir("target"), draft=params.model_dir("draft"),
                         masks=[mask_paths(params)["mask"]], device="cpu")
    examples = load_examples(params.data.dir, "stdlib_continuation", "dev")  # the smoke split: 4 prompts
    n = len(examples)
    assert n >= 4
    alone = DevSet(models, examples, 12)
    batched = DevSet(models, examples, 12, batch_size=3, wall_prompts=2, shared=None)
    assert batched.reference == alone.reference and batched.ar_task == alone.ar_task
    batched.pass_cost = alone.measure_pass_cost()
    policies = [replace(alone.base, gamma=3, score="ratio", tau_accept=1.0, tau_slim=0.5),
                replace(alone.base, gamma=3, tau_accept=math.inf, tau_slim=math.inf),  # tiers off: SD
                replace(alone.base, router="oracle", gamma=3)]
    for policy in policies:
        one, many = alone.evaluate(policy), batched.evaluate(policy)
        assert one["timed_prompts"] == n and many["timed_prompts"] == 2 and many["prompts"] == n
        for key in ("cost_per_token", "fidelity", "task_score", "agreement", "rejection_rate", "pass_widths_per_token",
                    "passes_per_token"):
            assert many[key] == pytest.approx(one[key]), (policy.router, key)
        assert many["decode_wall_per_token"] > 0
