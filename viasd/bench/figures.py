"""What `viasd bench`'s timed rounds mean: per method its tokens/s and pass figures, the ratios between
methods measured side by side and under the cost model, the oracle's headroom over `sd` and the share
`viasd` takes, the efficiencies, and the markdown table of all of it.

Ideal speedup (docs/method.md (speculative decoding), generalised to any pass mix): a method whose engine spent nothing
outside its model passes would need `sum_m P_m c_m` seconds for its `N` tokens (`P_m` passes of
model `m` at the measured mean cost `c_m`, from its own run); against the measured `ar` time per
token `t_ar`, `ideal = t_ar N / sum_m P_m c_m`, and `efficiency = measured / ideal` is the share
of the method's wall time spent in model passes (1.0 = no engine overhead). For `sd` the paper's
closed form `(1 - a^(g+1)) / ((1 - a)(g c + 1))` with the measured acceptance `a` (verify pass
costed as one target step) is reported beside it.

Pure library code: measured seconds and decode statistics in, JSON-ready dicts and text out.
"""

from __future__ import annotations

import statistics

from ..decoding.stats import DecodeStats
from ..decoding.tier_router import headroom_share
from ..metrics.speed import describe, within_noise
from ..search.pass_cost import cost_per_token, costs_to_json, fit_pass_costs, widths_per_token


def _ideal(stats: DecodeStats, ar_seconds_per_token: float) -> float | None:
    model_time = sum(stats.time_s.values())
    return stats.new_tokens * ar_seconds_per_token / model_time if model_time else None


def summarise(methods, seconds, n_tokens, stats, counts, memory, peeks=None) -> dict:
    """The benchmark's JSON: per method its rates over the timed rounds (`seconds`), pass counts (ours from
    `stats`, transformers' from hook `counts`), peak `memory` and decode statistics; the measured and modelled
    ratios, the oracles' headroom shares (`peeks`: an oracle's peek seconds in each timed round, taken off its
    rounds), and the efficiencies against `ar`."""
    per = {}
    for m in methods:
        rates = [n_tokens / s for s in seconds[m.name]]
        s = stats.get(m.name)
        # ours: the engine's own pass counts (a routed slim view shares the target's modules, hooks
        # included, so hook counts would mix them); transformers: forward hooks on the two models
        passes = {"draft": 0, **s.passes} if s is not None else counts[m.name]  # see run_benchmark
        row = {"tokens_per_second": {"median": statistics.median(rates), "min": min(rates), "max": max(rates),
                                     "rounds": rates},
               "peak_memory_mb": memory[m.name],
               "forward_passes_per_token": {k: v / n_tokens for k, v in passes.items()}}
        if s is not None:
            row.update({"acceptance_rate": s.acceptance_rate, "rejection_rate": s.rejection_rate,
                        "mean_accepted_length": s.mean_accepted_length, "tokens_per_block": s.tokens_per_block,
                        "block_escalation_rate": s.block_escalation_rate, "gated_rate": s.gated_rate,
                        "position_pass_rates": s.position_pass_rates(), "lagged_rolled_back": s.lagged_rolled_back,
                        "position_escalation_rate": s.position_escalation_rate, "slim_error_rate": s.slim_error_rate,
                        "router_seconds_per_block": s.router_time_s / s.blocks if s.blocks else None,
                        "layer_tokens_per_token": {k: v / max(s.new_tokens, 1) for k, v in s.layer_tokens.items()},
                        "pass_cost_s": {k: s.time_s[k] / s.passes[k] for k in s.passes if s.passes[k]}})
        else:  # transformers: one target pass per verify step
            target_passes = counts[m.name].get("target", 0)
            row.update({"acceptance_rate": None, "rejection_rate": None,
                        "mean_accepted_length": (n_tokens / target_passes - 1) if m.name != "hf_ar" and target_passes else None})
        per[m.name] = row
    med = {name: row["tokens_per_second"]["median"] for name, row in per.items()}

    def ratio(a, b):
        return med[a] / med[b] if a in med and b in med else None

    best_hf_assisted = max((n for n in ("hf_assisted", "hf_assisted_fixed", "hf_assisted_heuristic") if n in med),
                           key=med.get, default=None)
    ratios = {"ar_vs_hf_ar": ratio("ar", "hf_ar"),
              "sd_vs_hf_assisted": ratio("sd", best_hf_assisted) if best_hf_assisted else None,
              "sd_vs_ar": ratio("sd", "ar"), "viasd_vs_sd": ratio("viasd", "sd"), "viasd_vs_ar": ratio("viasd", "ar"),
              "cascade_sd_vs_ar": ratio("cascade_sd", "ar"), "spec_cascade_vs_ar": ratio("spec_cascade", "ar"),
              "self_sd_vs_ar": ratio("self_sd", "ar"), "self_sd_vs_hf_early_exit": ratio("self_sd", "hf_early_exit"),
              "hf_assisted_vs_hf_ar": ratio(best_hf_assisted, "hf_ar") if best_hf_assisted else None}
    efficiency = {}
    ar = stats.get("ar")
    # the cost model's ratios beside the measured ones: each method's decoding passes priced by per-layout,
    # per-width costs (`search.pass_cost`) fitted on every method that ran that runner layout, so that the
    # prediction compares passes, not one round's timing noise; e.g. viasd_vs_sd_model = T_sd / T_viasd
    unit = fit_pass_costs(stats.values())
    model_time = {n: cost_per_token(widths_per_token(st), unit) for n, st in stats.items()}
    ratios_model = {f"{a}_vs_{b}_model": model_time[b] / model_time[a]
                    for a, b in (("viasd", "sd"), ("viasd", "spec_cascade"), ("sd", "ar"), ("viasd", "ar"),
                                 ("viasd-oracle", "sd"), ("viasd-oracle_budget", "sd"), ("viasd-rules", "sd"))
                    if a in model_time and b in model_time and model_time[a]}
    ratios["viasd-rules_vs_sd"] = ratio("viasd-rules", "sd")
    headroom = _oracle_figures(per, med, seconds, peeks or {}, n_tokens, ratios, ratios_model)
    if ar is not None and ar.passes.get("target") and "ar" in med:
        step = ar.time_s["target"] / ar.passes["target"]
        for name in ("sd", "cascade_sd", "spec_cascade", "viasd"):
            if name in stats:
                ideal = _ideal(stats[name], 1.0 / med["ar"])
                measured = med[name] / med["ar"]
                entry = {"measured_speedup": measured, "ideal_speedup": ideal,
                         "efficiency": measured / ideal if ideal else None}
                if name == "sd":
                    entry["ideal_speedup_closed_form"] = _closed_form(stats[name], step)
                efficiency[name] = entry
    ratios = {k: v for k, v in ratios.items() if v is not None}
    return {"methods": per, "ratios": ratios, "efficiency": efficiency,
            "ratio_rounds": _ratio_rounds(ratios, _round_rates(seconds, peeks or {}, n_tokens), best_hf_assisted),
            "ratios_model": ratios_model, "pass_cost_model": costs_to_json(unit), "best_hf_assisted": best_hf_assisted,
            "oracle_headroom_taken": {k: v for k, v in headroom.items() if v is not None},
            # how close the cost model comes: modelled ratio / measured ratio (1 = exact)
            "model_over_measured": {k: ratios_model[f"{k}_model"] / v for k, v in ratios.items()
                                    if v and f"{k}_model" in ratios_model}}




def _oracle_figures(per: dict, med: dict, seconds: dict, peeks: dict, n_tokens: int, ratios: dict,
                    ratios_model: dict) -> dict:
    """The oracles' tokens/s without their peeks (into `per`), their measured ratios to sd (into `ratios`), and
    the share of each one's headroom over sd that viasd takes: measured against the measured oracle, measured
    against the modelled one, and modelled (`viasd_*` for the plain oracle, `viasd_*_at_floor` for the budgeted
    one at the fidelity floor)."""
    own = _own_seconds(seconds, peeks)
    for name, taken_off in peeks.items():
        # an oracle's peek passes are timed apart in every round (the plain oracle's for its last blocks only: it
        # reads the target's greedy outputs, `run_benchmark`; the budgeted one's at every block once its output
        # has left them): its tokens/s is the median over the rounds of its round's seconds less its peeks'
        rest = statistics.median(own[name])
        per[name]["tokens_per_second_without_peek"] = n_tokens / rest if rest > 0 else None
        per[name]["peek_seconds_per_round"] = taken_off
        if "sd" in med and per[name]["tokens_per_second_without_peek"]:
            ratios[f"{name}_vs_sd"] = per[name]["tokens_per_second_without_peek"] / med["sd"]
    shares = {}
    for name, suffix in (("viasd-oracle", ""), ("viasd-oracle_budget", "_at_floor")):
        oracle_model = ratios_model.get(f"{name}_vs_sd_model")
        shares.update({
            f"viasd_measured{suffix}": headroom_share(ratios.get("viasd_vs_sd"), ratios.get(f"{name}_vs_sd")),
            f"viasd_measured_oracle_modelled{suffix}": headroom_share(ratios.get("viasd_vs_sd"), oracle_model),
            f"viasd_model{suffix}": headroom_share(ratios_model.get("viasd_vs_sd_model"), oracle_model)})
    return shares


def _own_seconds(seconds: dict, peeks: dict) -> dict[str, list[float]]:
    """Each method's seconds in every timed round, an oracle's with that round's peek seconds taken off."""
    return {name: [s - p for s, p in zip(rounds, peeks[name])] if name in peeks else rounds
            for name, rounds in seconds.items()}


def _round_rates(seconds: dict, peeks: dict, n_tokens: int) -> dict[str, list[float]]:
    """Each method's tokens/s in every timed round (`_own_seconds`; none for a method with a round at or below 0)."""
    return {name: [n_tokens / r for r in rest] for name, rest in _own_seconds(seconds, peeks).items()
            if all(r > 0 for r in rest)}


def _ratio_rounds(ratios: dict, rates: dict[str, list[float]], best_hf_assisted: str | None) -> dict:
    """Per measured ratio `a_vs_b`, its value in each timed round, `rate_a / rate_b` of the same round, as
    min / median / max: the methods of a round run one after the other, so a drift of the machine's speed
    between rounds cancels in these, and their range is how far one round's figure can be trusted."""
    out = {}
    for key in ratios:
        a, _, b = key.partition("_vs_")
        a, b = (best_hf_assisted if n == "hf_assisted" else n for n in (a, b))
        if a in rates and b in rates:
            per_round = [x / y for x, y in zip(rates[a], rates[b])]
            out[key] = {"min": min(per_round), "median": statistics.median(per_round), "max": max(per_round)}
    return out


def _closed_form(s: DecodeStats, step: float) -> float | None:
    """(1 - a^(g+1)) / ((1 - a)(g c + 1)), a = acceptance rate, g = drafts per block, c = draft/target step cost."""
    a = s.acceptance_rate
    if a is None or not s.blocks or not s.passes.get("draft"):
        return None
    g = s.drafted / s.blocks
    c = (s.time_s["draft"] / s.passes["draft"]) / step
    expected = (g + 1) if a >= 1 else (1 - a ** (g + 1)) / (1 - a)
    return expected / (g * c + 1)


def markdown(result: dict, title: str) -> str:
    lines = [f"# {title}\n", "| method | tokens/s (median) | min–max | fidelity | outputs ≠ ar | task metric | task drop (SE) | "
             "acceptance | mean acc. length | target passes/token | slim passes/token | drafter passes/token | peak MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def f(x, p=3):
        return "–" if x is None else f"{x:.{p}f}"

    def drop(q):  # the task drop with its standard error in brackets
        se = q.get("task_drop_se")
        return f(q.get("task_drop"), 2) + ("" if se is None else f" ({se:.2f})")

    def differing(q):  # the prompts whose output is not the reference method's, of all
        n = q.get("outputs_differing")
        return "–" if n is None else f"{n}/{result['prompts']}"

    for name, row in result["methods"].items():
        tps = row["tokens_per_second"]
        fp = row["forward_passes_per_token"]
        q = row.get("quality") or {}
        lines.append(f"| {name} | {f(tps['median'], 1)} | {f(tps['min'], 1)}–{f(tps['max'], 1)} | "
                     f"{f(q.get('fidelity'))} | {differing(q)} | {f(q.get('task_score'), 2)} | {drop(q)} | "
                     f"{f(row['acceptance_rate'])} | {f(row['mean_accepted_length'])} | {f(fp.get('target'))} | "
                     f"{f(fp.get('slim'))} | {f(fp.get('feature') or fp.get('draft'))} | "  # a feature drafter's
                     f"{f(row['peak_memory_mb'], 0)} |")
    for name, own in result.get("baseline_settings", {}).items():
        lines.append(f"\n{name} runs at its own best setting on dev: " + ", ".join(f"{k} {v}" for k, v in own.items()))
    for tie in result.get("numerical_ties", []):
        lines.append(f"\n{tie['method']} parts from {tie['reference']} on prompt {tie['prompt']} at position "
                     f"{tie['position']}: a numerical tie (logit gap {tie['logit_gap']:.3g}, noise {tie['noise']:.3g})")
    spread = result.get("ratio_rounds", {})
    lines += ["", "| ratio | value | per round: min – median – max |", "|---|---|---|"]
    lines += [f"| {k} | {v:.3f} | " + (f"{spread[k]['min']:.3f} – {spread[k]['median']:.3f} – {spread[k]['max']:.3f}"
                                        if k in spread else "–") + " |" for k, v in result["ratios"].items()]
    lines += [f"| {k} (cost model; model / measured {result.get('model_over_measured', {}).get(k[:-6], float('nan')):.3f}) "
              f"| {v:.3f} | |" for k, v in result.get("ratios_model", {}).items()]
    lines += [f"| share of the oracle's headroom over sd taken by viasd ({k.replace('_', ' ')}) "
              f"| {v:.3f} | |" for k, v in result.get("oracle_headroom_taken", {}).items()]
    if "viasd-oracle" in result["methods"]:
        lines.append("\nviasd-oracle reads the target's greedy tokens it decides by from the greedy outputs decoded "
                     "before the rounds; the last blocks of a prompt, whose rows run past them, peek: its ratio to sd "
                     "(`viasd-oracle_vs_sd`) takes each round's peek seconds off, and the cost model never prices them.")
    if "viasd-oracle_budget" in result["methods"]:
        lines.append("\nviasd-oracle_budget is the oracle that may settle wrong tokens down to the fidelity floor (the "
                     "ceiling of a router spending the same fidelity, `_at_floor` above); once its output has left the "
                     "target's greedy one it peeks at every block, and its ratio takes each round's peek seconds off.")
    if result.get("intervals"):
        lines += ["", f"Per-prompt paired ratios (decode seconds per token, the prefill apart; transformers' calls "
                      f"include it), geometric mean over {result['prompts']} prompts with a 95 % interval clustered "
                      f"by source file; `sd` at γ {result.get('gamma')} ({result.get('gamma_source', 'given')}):", "",
                  "| ratio | geometric mean [95% CI] | inside the noise |", "|---|---|---|"]
        lines += [f"| {k} | {describe(v)} | {'–' if within_noise(v) is None else 'yes' if within_noise(v) else 'no'} |"
                  for k, v in result["intervals"].items() if v]
    lines += ["", "| method | measured speedup vs ar | ideal | efficiency |", "|---|---|---|---|"]
    lines += [f"| {k} | {f(v['measured_speedup'])} | {f(v['ideal_speedup'])} | {f(v['efficiency'])} |"
              for k, v in result["efficiency"].items()]
    return "\n".join(lines) + "\n"

