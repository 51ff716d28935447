"""The study report's drafter comparison: on every drafter the grid decoded both SD and VIA-SD with, does the
middle tier pay?

The drafters: the pair's draft model (`sd`, `viasd`), the feature drafter on the shared trunk (`sd-drafter_feature`,
`viasd-drafter_feature`) and the target's own first layers (`sd-drafter_self`, `viasd-drafter_self`). Each SD runs
at its own best γ on dev; each VIA-SD with its own router and thresholds. Per drafter, on the test split: SD on it
against `sd` (how strong a drafter it is), VIA-SD on it against SD on it (per-prompt paired ratios of decode
seconds per token, 95 % intervals clustered by source file, `metrics.speed`), VIA-SD's quality; and from its
threshold search on dev, the ceiling the oracle router reaches over SD on that drafter (at the search's fidelity
floor, and at fidelity 1, by the cost model) and the share of the floor's ceiling the tuned policy took there.
"""

from __future__ import annotations

from ..metrics.speed import describe, run_vs
from .tables import fmt, markdown

# drafter -> (SD on it, VIA-SD on it, its threshold search's file name)
DRAFTERS = {"draft model": ("sd", "viasd", "main"),
            "feature drafter": ("sd-drafter_feature", "viasd-drafter_feature", "drafter_feature"),
            "self (the target's first layers)": ("sd-drafter_self", "viasd-drafter_self", "drafter_self")}


def verdict(ratio: dict | None) -> str:
    """`pays`, `costs` or `within noise`, from where the 95 % interval of VIA-SD over SD on a drafter lies."""
    if not ratio:
        return "–"
    low, high = ratio.get("low"), ratio.get("high")
    if low is not None and low > 1:
        return "pays"
    if high is not None and high < 1:
        return "costs"
    return "within noise"


def drafter_rows(evals: list[dict], searches: dict[str, dict | None]) -> list[dict]:
    """One row per drafter with both runs in `evals` (`tables.with_speed`'s records of one pair and task);
    `searches`: the threshold search's record of each search file name (`main`, `drafter_self`, ...), None where
    it has not run."""
    by_run = {e["run"]: e for e in evals}
    rows = []
    for drafter, (sd_run, viasd_run, search_name) in DRAFTERS.items():
        if sd_run not in by_run or viasd_run not in by_run:
            continue
        sd, viasd = by_run[sd_run], by_run[viasd_run]
        ratio = run_vs(sd.get("speed"), viasd.get("speed"))
        search = searches.get(search_name) or {}
        ceiling = (search.get("oracle") or {}).get("sd_over_oracle_cost")
        at_floor = (search.get("oracle_at_floor") or {}).get("sd_over_oracle_cost")
        quality = viasd.get("quality") or {}
        rows.append({
            "drafter": drafter,
            "sd": f"`{sd_run}` γ {(sd.get('policy') or {}).get('gamma', '–')}",
            "acceptance": fmt(sd.get("acceptance_rate")),
            "sd_vs_sd": "1" if sd_run == "sd" else describe(run_vs(by_run["sd"].get("speed"), sd.get("speed")))
            if "sd" in by_run else "–",
            "viasd_vs_own_sd": describe(ratio),
            "quality": f"fidelity {fmt(quality.get('fidelity'))}, task drop {fmt(quality.get('task_drop'))}",
            "ceiling": f"{fmt(at_floor)}× / {fmt(ceiling)}×" if at_floor or ceiling else "–",
            "share": fmt(search.get("headroom_taken_at_floor")),
            "verdict": verdict(ratio),
        })
    return rows


COLUMNS = (("drafter", "drafter"), ("sd", "SD on it"), ("acceptance", "its acceptance"),
           ("sd_vs_sd", "SD on it vs `sd` [95 % CI]"), ("viasd_vs_own_sd", "VIA-SD on it vs SD on it [95 % CI]"),
           ("quality", "VIA-SD's quality"), ("ceiling", "oracle ceiling over SD on it, dev: at the floor / fidelity 1"),
           ("share", "VIA-SD's share of the floor's ceiling, dev"), ("verdict", "the middle tier"))


def drafters_section(rows: list[dict]) -> list[str]:
    """The summary's section on the drafters (empty unless the grid decoded SD and VIA-SD on a drafter other
    than the draft model)."""
    if len(rows) < 2:
        return []
    return ["### The middle tier on each drafter\n",
            "For each drafter the grid decoded both SD and VIA-SD with (each SD at its own best γ on dev, each VIA-SD "
            "with its own router and thresholds), test split: whether VIA-SD's middle tier pays on top of it "
            "(`pays` / `costs`: the interval excludes 1; else `within noise`), and the ceiling its threshold search "
            "measured on dev for the oracle router on that drafter, which bounds what a router can take there.\n",
            markdown(rows, COLUMNS)]
