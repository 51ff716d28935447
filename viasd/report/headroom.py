"""The study report's oracle comparison: per task, `sd` (at its best gamma on dev), the tuned `viasd` and the
oracles side by side, and the share of each oracle's headroom over SD that VIA-SD takes,
`(viasd/sd - 1) / (oracle/sd - 1)`: first the budgeted oracle's at the fidelity floor, then the fidelity-1 one's.

Pure functions of the evaluated runs (`evaluate_stage`'s records: per-prompt `speed`, the decode's pass widths,
policy, quality) and the threshold search's cost model (`search.pass_cost`), beside the same model on the
decode job's own timed passes (`job_costs`); `stages/report.py` reads the files and writes the text.
"""

from __future__ import annotations

from ..decoding.engine import LOOP
from ..decoding.policy import METHODS
from ..decoding.tier_router import headroom_share
from ..metrics.speed import run_vs
from ..search.pass_cost import cost_per_token, fit_pass_costs, split_key, widths_per_token


def modelled_seconds_per_token(e: dict, costs: dict) -> float | None:
    """A decoded run's seconds per generated token under the cost model `costs` (its decoding passes, the
    loop's work included, the prefill and an oracle's peeks left out); None if a layout is not priced."""
    # the search decodes every policy, SD included (tiers off), through viasd's loop: its `loop:viasd` cost
    # prices the loop of the `sd` run too, where `costs` has no loop cost of that method's own
    viasd_loop = costs.get(f"{LOOP}:viasd")
    priced = {**({f"{LOOP}:{m}": viasd_loop for m in METHODS} if viasd_loop else {}), **costs}
    widths = widths_per_token(e)
    if not e.get("new_tokens") or any(split_key(k)[0] not in priced for k in widths):
        return None
    return cost_per_token(widths, priced)


def vs_sd(by_run: dict, run: str, costs: dict) -> tuple[float | None, float | None]:
    """Run `run` against `sd` (SD at its best gamma on dev): measured (the geometric mean of the per-prompt
    paired ratios of decode seconds per token, `metrics.speed`) and modelled (sd's modelled seconds per token
    over the run's; None if either has an unpriced pass)."""
    ratio = run_vs(by_run["sd"].get("speed"), by_run[run].get("speed"))
    sd, own = (modelled_seconds_per_token(by_run[r], costs) for r in ("sd", run))
    return (ratio["ratio"] if ratio else None), (sd / own if sd and own else None)


JOB_RUNS = ("sd", "viasd", "viasd-oracle", "viasd-oracle_budget")


def job_costs(by_run: dict) -> dict:
    """Per-pass costs fitted on the decode job's own passes (its `sd`, `viasd` and oracle runs pooled, as the
    bench fits its own): the speeds of the machine and day the job ran on, where the search's costs are
    the speeds of the day it ran."""
    return fit_pass_costs(by_run[r] for r in JOB_RUNS if r in by_run)


def _on_job_costs(by_run: dict) -> str:
    """`viasd` and the oracle against `sd` on the job's own pass costs (empty where its passes carry no
    timings): the cost model against the measured ratio on one machine and day; what stays between them is
    the prefill (no method's cost) and the work outside the timed passes."""
    costs = job_costs(by_run)
    (_, viasd), (_, oracle) = vs_sd(by_run, "viasd", costs), vs_sd(by_run, "viasd-oracle", costs)
    if viasd is None or oracle is None:
        return ""
    return (f" On this job's own pass costs (fitted on its runs' timed passes) `viasd` {viasd:.3f}× and the oracle "
            f"{oracle:.3f}×: the cost model on the decode job's machine and day, without the prefill.")


def _f(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def oracle_headroom(evals: list[dict], costs: dict | None) -> str:
    """`sd` (at its best gamma on dev), the tuned `viasd` and the two oracle routers side by side, and the share
    of each oracle's headroom over SD that VIA-SD takes, measured (per-prompt paired ratios of decode seconds
    per token, every run in the decode job's balanced order, the oracles' peeks timed apart) and modelled.

    The headline share is against the budgeted oracle at the search's fidelity floor (`viasd-oracle_budget`):
    a router that may spend the fidelity the tuned `viasd` may spend; the fidelity-1 oracle's share stands
    beside it. Both oracles are reference heuristics of this engine's tier rules, not bounds: another rule
    set, or a router that also varies gamma, can go past them."""
    by_run = {e["run"]: e for e in evals}
    if not all(r in by_run for r in ("sd", "viasd", "viasd-oracle")):
        return "The study has no `sd`, `viasd` and `viasd-oracle` runs to compare.\n"
    costs = costs or {}
    (viasd, viasd_model), (oracle, oracle_model) = vs_sd(by_run, "viasd", costs), vs_sd(by_run, "viasd-oracle", costs)
    if viasd is None or oracle is None or viasd_model is None or oracle_model is None:
        return "The cost model does not price every pass of `sd`, `viasd` and `viasd-oracle`, or they share no prompt.\n"
    router = by_run["viasd"].get("policy", {}).get("router", "rules")
    return (_at_floor(by_run, costs, viasd, viasd_model)
            + f"Against the fidelity-1 oracle router (every tier decided by the target's greedy token): "
            f"{oracle:.3f}× `sd` measured, {oracle_model:.3f}× by the cost model; the tuned `viasd` ({router}, γ "
            f"{by_run['viasd']['policy']['gamma']}; `sd` at γ {by_run['sd']['policy']['gamma']}) {viasd:.3f}× measured, "
            f"{viasd_model:.3f}× modelled, takes {_f(headroom_share(viasd, oracle), 2)} (measured) / "
            f"{_f(headroom_share(viasd_model, oracle_model), 2)} (modelled) of its headroom. Per position, "
            f"`viasd` escalated {_f(by_run['viasd'].get('position_escalation_rate'))} of the positions its tiers "
            f"examined, where the slim was wrong on {_f(by_run['viasd-oracle'].get('slim_error_rate'))} (oracle run)."
            + _on_job_costs(by_run) + "\n")


def _at_floor(by_run: dict, costs: dict, viasd: float, viasd_model: float) -> str:
    """The headline sentence: the budgeted oracle at the fidelity floor (`viasd-oracle_budget`: a router that may
    settle as many wrong tokens as the search's floor allows, as the tuned `viasd` may) and the share of its
    headroom `viasd` takes; empty without that run or its modelled cost."""
    if "viasd-oracle_budget" not in by_run:
        return ""
    run = by_run["viasd-oracle_budget"]
    measured, modelled = vs_sd(by_run, "viasd-oracle_budget", costs)
    if modelled is None or measured is None:
        return ""
    return (f"**Headroom at the fidelity floor:** the budgeted oracle router (it may settle "
            f"{run['policy'].get('oracle_budget', 0):.2f} of its tokens wrong) {measured:.3f}× `sd` measured, "
            f"{modelled:.3f}× by the cost model, fidelity {_f(run['quality'].get('fidelity'))}, task drop "
            f"{_f(run['quality'].get('task_drop'), 2)}: the tuned `viasd` takes **{_f(headroom_share(viasd, measured), 2)}** "
            f"(measured) / {_f(headroom_share(viasd_model, modelled), 2)} (modelled) of its headroom.\n\n")
