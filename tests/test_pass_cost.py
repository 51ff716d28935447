"""The cost model's per-layout, per-width pass costs: the fit, the prefill left out, the pricing, and the
calibration per gamma on the decodes' wall time."""

import pytest

from viasd.decoding.stats import DecodeStats
from viasd.search.pass_cost import (
    PassCost,
    cost_per_token,
    costs_from_json,
    costs_to_json,
    fit_pass_costs,
    missing_layouts,
    widths_per_token,
)


def stats_with(passes: dict[str, tuple[int, float]], new_tokens: int = 10) -> DecodeStats:
    s = DecodeStats(method="sd", new_tokens=new_tokens)
    for key, (n, seconds) in passes.items():
        s.pass_widths[key] = n
        s.pass_width_s[key] = seconds
    return s


def test_fit_recovers_a_linear_cost_and_ignores_the_prefill():
    a, b = 0.004, 0.0005
    runs = [stats_with({f"target:12/{w}": (n, n * (a + b * w)) for w, n in ((2, 5), (3, 7))}),
            stats_with({"target:12/5": (4, 4 * (a + b * 5)), "target:12/prefill": (1, 0.5),
                        "draft:1/1": (20, 20 * 0.0004)})]
    costs = fit_pass_costs(runs)
    assert costs["target:12"].per_pass == pytest.approx(a)
    assert costs["target:12"].per_token == pytest.approx(b)
    assert costs["target:12"](7) == pytest.approx(a + 7 * b)
    # a single width: the mean per pass, flat in the width
    assert costs["draft:1"] == PassCost(pytest.approx(0.0004), 0.0)


def test_the_fit_keeps_each_layouts_total_time():
    """Least squares with an intercept: the fitted costs of the pooled passes add up to their measured seconds."""
    runs = [stats_with({"target:12/3": (9, 9 * 0.0071), "target:12/5": (6, 6 * 0.0076), "target:12/7": (3, 3 * 0.0089)}),
            stats_with({"target:12/5": (4, 4 * 0.0079), "target:12/prefill": (1, 0.2)})]
    cost = fit_pass_costs(runs)["target:12"]
    assert cost.per_token > 0
    measured = 9 * 0.0071 + 6 * 0.0076 + 3 * 0.0089 + 4 * 0.0079
    assert 9 * cost(3) + 10 * cost(5) + 3 * cost(7) == pytest.approx(measured)


def test_a_noisy_negative_slope_falls_back_to_the_mean():
    costs = fit_pass_costs([stats_with({"trunk:6/2": (10, 10 * 0.006), "trunk:6/3": (10, 10 * 0.005)})])
    assert costs["trunk:6"].per_token == 0.0
    assert costs["trunk:6"].per_pass == pytest.approx(0.0055)


def test_pricing_follows_the_width():
    """A 7-token pass costs more than a 3-token one: the flaw of a per-layout cost, which priced both alike."""
    costs = {"target:12": PassCost(0.004, 0.001), "draft:1": PassCost(0.0005, 0.0)}
    long = stats_with({"target:12/7": (2, 0.0), "draft:1/1": (12, 0.0), "target:12/prefill": (1, 9.0)}, new_tokens=10)
    widths = widths_per_token(long)
    assert widths == {"target:12/7": 0.2, "draft:1/1": 1.2}  # the prefill is not priced
    assert cost_per_token(widths, costs) == pytest.approx(0.2 * 0.011 + 1.2 * 0.0005)
    assert missing_layouts(long, {"draft:1": costs["draft:1"]}) == {"target:12"}
    assert costs_from_json(costs_to_json(costs)) == costs
    assert costs_from_json({"target:12": 0.01}) is None  # an older search's flat per-pass costs: measured again


def test_decode_seconds_leave_out_the_prefill_and_the_encoding():
    from viasd.search.pass_cost import decode_seconds

    s = stats_with({"target:4/prefill": (1, 0.3), "target:4/3": (5, 0.5)})
    s.wall_time_s, s.encoder_time_s = 1.2, 0.1
    assert decode_seconds(s) == pytest.approx(0.8)


def test_the_wall_factor_per_gamma_pools_the_decodes_weighted_by_prompts():
    """Per gamma: sum(prompts x wall) / sum(prompts x model) over every point; a recalibration (a competing
    search's trials come calibrated) starts from the model cost a point kept, not from its calibrated one."""
    from viasd.search.wall_factors import calibrated, wall_factors

    points = [{"gamma": 2, "cost_per_token": 1.0, "decode_wall_per_token": 1.2, "prompts": 3},
              {"gamma": 2, "cost_per_token": 2.0, "decode_wall_per_token": 2.0, "prompts": 1},  # a pruned trial
              {"gamma": 4, "cost_per_token": 1.0, "decode_wall_per_token": 0.9, "prompts": 4}]
    factors = wall_factors(points)
    assert factors == pytest.approx({2: (3 * 1.2 + 2.0) / (3 * 1.0 + 2.0), 4: 0.9})
    once = [calibrated(p, factors) for p in points]
    assert once[0]["cost_per_token"] == pytest.approx(1.12) and once[0]["cost_model_per_token"] == 1.0
    assert once[2]["cost_per_token"] == pytest.approx(0.9)
    again = [calibrated(p, wall_factors(once)) for p in once]
    assert [p["cost_per_token"] for p in again] == pytest.approx([p["cost_per_token"] for p in once])
