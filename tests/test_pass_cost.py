"""The cost model's per-layout, per-width pass costs: the fit, the prefill left out, and the pricing."""

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
