"""Speed ratios with intervals (`viasd.metrics.speed`): the geometric mean of paired per-prompt ratios and its
interval clustered by source file, by hand."""

import math

import pytest
from scipy.stats import t as student_t

from viasd.metrics.speed import describe, mean_over_rounds, paired_ratio, run_vs, seconds_per_token, within_noise


def test_the_ratio_is_the_geometric_mean_of_paired_ratios():
    base, ours = [2.0, 4.0, 1.0], [1.0, 1.0, 1.0]  # per-prompt ratios 2, 4, 1
    out = paired_ratio(base, ours)
    assert out["ratio"] == pytest.approx((2 * 4 * 1) ** (1 / 3)) and out["prompts"] == 3 and out["groups"] == 3
    logs = [math.log(2), math.log(4), 0.0]
    mean = sum(logs) / 3
    se = math.sqrt(3 / 2 * sum((v - mean) ** 2 for v in logs) / 9)
    half = student_t.ppf(0.975, 2) * se
    assert out["low"] == pytest.approx(math.exp(mean - half)) and out["high"] == pytest.approx(math.exp(mean + half))


def test_prompts_of_one_file_count_as_one_cluster():
    base, ours = [2.0, 2.0, 1.0, 1.0], [1.0] * 4
    apart = paired_ratio(base, ours, ["a", "b", "c", "d"])
    together = paired_ratio(base, ours, ["a", "a", "b", "b"])
    assert apart["ratio"] == together["ratio"] == pytest.approx(math.sqrt(2))
    assert together["groups"] == 2 and together["high"] - together["low"] > apart["high"] - apart["low"]
    # the cluster-robust variance by hand: two clusters, residual sums +-2 * log(2) / 2
    r = math.log(2) / 2
    se = math.sqrt(2 / 1 * (2 * r) ** 2 * 2 / 16)
    assert together["high"] == pytest.approx(math.sqrt(2) * math.exp(student_t.ppf(0.975, 1) * se))


def test_unpaired_prompts_and_one_group():
    assert paired_ratio([1.0, None], [None, 1.0]) is None
    one = paired_ratio([2.0, 2.0], [1.0, 1.0], ["f", "f"])
    assert one["ratio"] == pytest.approx(2.0) and one["low"] is None and within_noise(one) is None
    assert describe(one) == "2.000×" and describe(None) == "–"
    with pytest.raises(ValueError):
        paired_ratio([1.0], [1.0, 2.0])


def test_within_noise_and_rounds():
    assert within_noise({"ratio": 1.1, "low": 0.95, "high": 1.2}) is True
    assert within_noise({"ratio": 1.2, "low": 1.1, "high": 1.3}) is False
    assert mean_over_rounds([[1.0, 4.0], [4.0, 1.0]]) == pytest.approx([2.0, 2.0])


def test_seconds_per_token_leaves_the_prefill_out_and_runs_pair_by_id():
    assert seconds_per_token({"new_tokens": 4, "decode_time_s": 2.0, "wall_time_s": 3.0}) == 0.5
    assert seconds_per_token({"new_tokens": 0, "decode_time_s": 1.0}) is None
    assert seconds_per_token({"new_tokens": 2, "wall_time_s": 1.0}) == 0.5  # an older row: its wall time
    sd = {"ids": ["x", "y", "z"], "groups": ["f", "g", "h"], "seconds_per_token": [2.0, 2.0, 9.0]}
    ours = {"ids": ["y", "x"], "groups": ["g", "f"], "seconds_per_token": [1.0, 1.0]}
    assert run_vs(sd, ours)["ratio"] == pytest.approx(2.0) and run_vs(sd, ours)["prompts"] == 2
    assert run_vs(None, ours) is None


def test_the_claims_table_sets_each_source_claim_beside_the_studys_figure(tmp_path):
    """`report/claims.py`: the rejection rate against cascade SD and Faster Cascades, viasd over the fastest lossless
    SD of the grid (read on these prompts), over greedy, the DIMR search's minutes, and the slim ablations, each with
    the quality beside it."""
    from viasd.report.claims import best_lossless, claim_rows, claims_table, dimr_seconds
    from viasd.report.tables import with_speed

    ids, groups = ["a", "b", "c", "d"], ["f", "f", "g", "h"]

    def run(name, method, seconds, rejection=None, fidelity=1.0):
        speed = {"ids": ids, "groups": groups, "seconds_per_token": [seconds] * 4,
                 "vs_ar": {"ratio": 4.0 / seconds, "low": None, "high": None}}
        return {"run": name, "method": method, "speed": speed, "rejection_rate": rejection,
                "quality": {"fidelity": fidelity, "task_drop": 0.2}}

    evals = with_speed([run("ar", "ar", 4.0), run("sd", "sd", 2.0, 0.30), run("self_sd", "self_sd", 1.6, 0.5),
                        run("cascade_sd", "cascade_sd", 2.2, 0.25), run("spec_cascade", "spec_cascade", 1.9, 0.28),
                        run("viasd", "viasd", 1.25, 0.10, 0.97), run("viasd-independent", "viasd", 2.0, 0.3),
                        run("viasd-mask_random", "viasd", 2.5, 0.3)])
    assert best_lossless(evals)["run"] == "self_sd"
    bench = tmp_path / "benchmarks" / "dimr_search"
    bench.mkdir(parents=True)
    (bench / "default.tsv").write_text("s\th:m:s\n600.0\t0:10:00\n")
    rows = claim_rows("continuation", evals, dimr_seconds(tmp_path / "benchmarks", "default"))
    by_claim = {r["claim"]: r["ours"] for r in rows}
    assert [r["claim"] for r in rows].count("rejection rate below cascade SD / Faster Cascades") == 2
    assert any(r["ours"].startswith("0.150 lower than `cascade_sd`") for r in rows)
    assert any(r["ours"].startswith("0.180 lower than `spec_cascade`") for r in rows)
    assert by_claim["speed over the best speculative decoding"].startswith("1.280× [") and "`self_sd`" in \
        by_claim["speed over the best speculative decoding"]
    assert by_claim["speed over greedy decoding"] == "3.200×"
    assert by_claim["DIMR search time per pair"].startswith("10.0 min")
    assert by_claim["DIMR slim against an independently trained one"].startswith("1.600×")
    assert all("fidelity 0.970" in r["quality"] for r in rows if r["claim"] != "DIMR search time per pair")
    assert "the source" in claims_table(rows).splitlines()[0]
    assert dimr_seconds(tmp_path / "nothing", "default") is None


def test_the_drafter_table_says_whether_the_middle_tier_pays_on_each_drafter():
    """`report/drafters.py`: one row per drafter with both an SD and a VIA-SD run; VIA-SD on it against SD on it as
    a paired ratio with its interval, SD on it against `sd`, the dev search's oracle ceiling and share, and a verdict
    that follows the interval (pays / costs / within noise); no section with the draft model alone."""
    from viasd.report.drafters import drafter_rows, drafters_section, verdict
    from viasd.report.tables import with_speed

    ids, groups = ["a", "b", "c", "d"], ["f", "g", "h", "i"]

    def run(name, method, seconds):
        speed = {"ids": ids, "groups": groups, "seconds_per_token": seconds,
                 "vs_ar": {"ratio": 1.0, "low": None, "high": None}}
        return {"run": name, "method": method, "speed": speed, "acceptance_rate": 0.5, "policy": {"gamma": 3},
                "quality": {"fidelity": 0.97, "task_drop": 0.1}}

    evals = with_speed([run("ar", "ar", [4.0] * 4), run("sd", "sd", [2.0] * 4),
                        run("viasd", "viasd", [1.6, 1.7, 1.5, 1.6]),
                        run("sd-drafter_self", "sd", [2.5] * 4),
                        run("viasd-drafter_self", "viasd", [2.4, 2.7, 2.5, 2.6])])
    searches = {"main": {"oracle": {"sd_over_oracle_cost": 1.3}, "oracle_at_floor": {"sd_over_oracle_cost": 1.4},
                         "headroom_taken_at_floor": 0.5},
                "drafter_self": None}
    rows = drafter_rows(evals, searches)
    assert [r["drafter"] for r in rows] == ["draft model", "self (the target's first layers)"]
    model, own = rows
    assert model["viasd_vs_own_sd"].startswith("1.25") and model["verdict"] == "pays"
    assert model["ceiling"] == "1.400× / 1.300×" and model["share"] == "0.500" and model["sd_vs_sd"] == "1"
    assert own["sd_vs_sd"].startswith("0.800×") and own["verdict"] == "within noise" and own["ceiling"] == "–"
    assert "fidelity 0.970" in own["quality"]
    assert verdict({"ratio": 0.9, "low": 0.85, "high": 0.95}) == "costs" and verdict(None) == "–"
    assert drafters_section(rows)[0].startswith("### The middle tier") and drafters_section(rows[:1]) == []
