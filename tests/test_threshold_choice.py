"""The choice among a threshold search's trials and the statistics it rests on, without models: the fidelity
bound on dev and on the held-out prompts, the clustered standard error, the file-disjoint held-out split, and
which config fields a search depends on. (The searches themselves, on the smoke family: test_threshold_search.)"""

import math
from statistics import NormalDist

import optuna
import pytest


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
    rejects a candidate whose fidelity holds. The held-out set gives set figures (a real DevSet cannot be made
    to measure a given SE); the real one confirms a search's choice in test_threshold_search."""
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
                    "task_score_ar": 10.0, "task_drop": drop, "task_drop_se": 0.5, "agreement": 0.5, "prompts": 48,
                    "pruned": False,
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
             "scores": {"score"}, "confidences": {"confidence"}, "tau_router": {"tau_router_accept", "tau_router_slim"},
             "router_start": set()}  # not a range: the start's points, drawn under tau_router's names
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


def test_costs_the_model_cannot_tell_apart_are_ranked_by_fidelity_margin():
    """Tiered candidates costing within `cost_resolution` of the cheapest are ties: the one with the highest
    fidelity lower bound is chosen (and would be confirmed) first, then the other ties by that bound, then the
    dearer candidates cheapest first; with `cost_resolution: 0` the cheapest is first again. `min_gain` still
    compares with the cheapest tiered candidate, and a tie that saves less than it is no candidate."""
    from dataclasses import replace

    from viasd.metrics.quality import QualityConstraints
    from viasd.search.choice import choose, rank_candidates
    from viasd.search.thresholds import ThresholdConfig

    cfg = ThresholdConfig(min_gain=0.03, cost_resolution=0.03,
                          quality=QualityConstraints(min_fidelity=0.95, max_task_drop=1.0))

    def point(number, cost, fidelity, se=0.005, tiers_off=False, drop=0.0):
        measured = {"fidelity": fidelity, "fidelity_se": se, "task_drop": drop}
        return {"number": number, "tiers_off": tiers_off, "cost_per_token": cost, **measured,
                "violations": cfg.quality.violations(measured), "feasible": not cfg.quality.violations(measured)}

    sd = point(None, 1.0, 1.0, 0.0, tiers_off=True)
    cheapest = point(1, 0.800, 0.967, drop=0.79)
    margin = point(2, 0.820, 0.985, drop=0.08)   # 2.5 % dearer: a tie, the higher bound
    middle = point(3, 0.810, 0.975)              # a tie, between the two
    dearer = point(4, 0.830, 0.999)              # 3.75 % dearer: not a tie, however sure
    cheaper_dearer = point(5, 0.825, 0.990)
    best, checks = choose([sd, cheapest, margin, middle, dearer, cheaper_dearer], cfg)
    assert best is margin and checks == []
    assert [t["number"] for t in rank_candidates([cheapest, margin, middle, dearer, cheaper_dearer], cfg)] == [2, 3, 1, 5, 4]
    assert choose([sd, cheapest, margin, middle, dearer], replace(cfg, cost_resolution=0.0))[0] is cheapest
    # the tie window is measured from the cheapest eligible candidate; a tie beyond min_gain of SD is none
    near_sd = point(6, 0.975, 0.999)
    assert choose([sd, point(7, 0.96, 0.97), near_sd], cfg)[0]["number"] == 7
    assert rank_candidates([], cfg) == []


def test_the_choice_ranks_the_calibrated_costs():
    """The model puts the tiered trial at gamma 2 cheapest (0.80 of SD at gamma 4); the wall time of the dev
    decodes says gamma 2 runs 20 % over its model and gamma 4 5 % under: calibrated, the gamma 4 trial (0.85 of
    the model's SD) is the one to take."""
    from viasd.metrics.quality import QualityConstraints
    from viasd.search.choice import choose
    from viasd.search.thresholds import ThresholdConfig
    from viasd.search.wall_factors import calibrated, wall_factors

    cfg = ThresholdConfig(quality=QualityConstraints(min_fidelity=0.95, max_task_drop=None))

    def point(number, gamma, model, wall, tiers_off=False):
        return {"number": number, "gamma": gamma, "tiers_off": tiers_off, "cost_per_token": model,
                "decode_wall_per_token": wall, "prompts": 24, "fidelity": 0.99, "fidelity_se": 0.001,
                "task_drop": None, "violations": {}, "feasible": True}

    points = [point(None, 2, 1.10, 1.32, True), point(None, 4, 1.00, 0.95, True), point(1, 2, 0.80, 0.96),
              point(2, 4, 0.85, 0.8075)]
    assert choose(points, cfg)[0]["number"] == 1  # the model alone
    factors = wall_factors(points)
    assert factors == pytest.approx({2: 1.2, 4: 0.95})
    best, _ = choose([calibrated(p, factors) for p in points], cfg)
    assert best["number"] == 2 and best["cost_per_token"] == pytest.approx(0.8075)


@pytest.mark.parametrize("routers", [("learned",), ("rules", "learned"), ("rules",)])
def test_the_learned_routers_search_starts_on_the_diagonal(routers):
    """`router_start_points`, enqueued in an Optuna study (`search_params`) and drawn through `suggest_policy`, are
    the policies they name, in order: each start probability at every gamma, both thresholds equal, the gate off, no
    forced catch-up, the lagged tokens unchecked; nothing for a search without the learned router. After them the
    sampler draws."""
    from viasd.decoding.policy import DecodePolicy
    from viasd.search.thresholds import ThresholdConfig, router_start_points, search_params, suggest_policy

    cfg = ThresholdConfig(routers=routers, gamma=(2, 4), router_start=(0.7, 0.8), gate=(0.0, 0.5), max_lag=(0, 16),
                          verify_lagged=(True, False), tau_router=(0.6, 0.99))
    starts = router_start_points(cfg)
    assert len(starts) == (4 if "learned" in routers else 0)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for start in starts:
        study.enqueue_trial(search_params(start, cfg))
    drawn = []
    for _ in range(len(starts) + 2):
        trial = study.ask()
        policy = suggest_policy(trial, DecodePolicy(), cfg)
        drawn.append(policy)
        study.tell(trial, 1.0)
    expected = [(2, 0.7), (4, 0.7), (2, 0.8), (4, 0.8)] if starts else []
    for policy, (gamma, tau) in zip(drawn, expected):
        assert (policy.router, policy.gamma, policy.tau_accept, policy.tau_slim) == ("learned", gamma, tau, tau)
        assert (policy.gate, policy.max_lag, policy.verify_lagged, policy.verify_block) == (0.0, 0, False, False)
    assert len({(p.tau_accept, p.tau_slim) for p in drawn[len(expected):]} - {(t, t) for _, t in expected}) == 2


def test_the_dynamic_draft_length_is_searched_only_where_its_range_is_open():
    """`thresholds.draft_stop`: an empty range (the default) draws nothing and keeps a fixed gamma; an open one
    draws first whether it is on, then the threshold, and a point's Optuna parameters (`search_params`) give it back."""
    from viasd.decoding.policy import DecodePolicy
    from viasd.search.thresholds import ThresholdConfig, search_params, suggest_policy

    closed = ThresholdConfig(routers=("learned",), gamma=(3,), tau_router=(0.6, 0.99))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    assert suggest_policy(trial, DecodePolicy(), closed).draft_stop == 0.0 and "draft_stop_on" not in trial.params
    study.tell(trial, 1.0)
    open_ = ThresholdConfig(routers=("learned",), gamma=(3,), tau_router=(0.6, 0.99), draft_stop=(0.0, 0.5),
                            gate=(0.0, 0.0), max_lag=(0,), verify_lagged=(True,), verify_block=(False,))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    drawn = []
    for _ in range(12):
        trial = study.ask()
        drawn.append((trial, suggest_policy(trial, DecodePolicy(), open_)))
        study.tell(trial, 1.0)
    values = {p.draft_stop for _, p in drawn}
    assert 0.0 in values and any(0 < v <= 0.5 for v in values)
    for trial, policy in drawn:
        point = {"router": "learned", "gamma": 3, "max_lag": 0, "verify_lagged": True, "tau_accept": policy.tau_accept,
                 "tau_slim": policy.tau_slim, "gate": 0.0, "draft_stop": policy.draft_stop}
        assert search_params(point, open_) == trial.params
