"""The report's headline of a task: the tuned `viasd` against SD at its own best γ, with its interval, every
quality measure beside it, and which differences the intervals cannot tell apart."""

from __future__ import annotations

from ..metrics.speed import describe, within_noise
from .tables import fmt

INTRO = ("Every run decodes the task's test prompts greedily, each prompt by every run in turn in a balanced order. "
         "Speed is decode time per generated token (the prompt's prefill timed apart); a ratio is the geometric mean "
         "of the per-prompt paired ratios, with a 95 % interval clustered by source file. `sd` runs at the γ its own "
         "dev search found cheapest (`sd-gamma_k`: SD at a fixed γ); every `vs sd` is against it. Rejection rate = "
         "positions rejected by the full model / verified positions (docs/method.md (statistics)). The test split "
         "is read to report: no choice is made on it.\n")


def headline(evals: list[dict], bounds: str) -> str:
    """The task's headline: the tuned `viasd` against SD at its own best gamma (chosen on dev), its interval and
    whether the difference is inside the noise, every quality measure beside it; then SD at each gamma on
    these test prompts against the dev choice, and which runs' differences from `sd` the intervals cannot
    tell apart."""
    by_run = {e["run"]: e for e in evals}
    if "sd" not in by_run:
        return ""
    sd_gamma = by_run["sd"]["policy"].get("gamma")
    lines = []
    if "viasd" in by_run:
        v = by_run["viasd"]
        q = v["quality"]
        noise = within_noise(v.get("vs_sd_best"))
        lines.append(
            f"**`viasd` (γ {v['policy'].get('gamma')}) against `sd` at its best γ on dev (γ {sd_gamma}): "
            f"{describe(v.get('vs_sd_best'))}** over {(v.get('vs_sd_best') or {}).get('prompts', 0)} test prompts from "
            f"{(v.get('vs_sd_best') or {}).get('groups', 0)} source files; fidelity {fmt(q.get('fidelity'))} "
            f"(SE {fmt(q.get('fidelity_se'))}), task drop {fmt(q.get('task_drop'))} (SE {fmt(q.get('task_drop_se'))}), "
            f"agreement {fmt(q.get('agreement'))}; the search's bars: {bounds}. "
            + ("The interval holds 1: the difference is inside the noise." if noise else
               "The interval excludes 1." if noise is not None else "No interval (fewer than two source files)."))
    fixed = [e for e in evals if e["method"] == "sd" and e["run"] != "sd"]
    if fixed:
        lines.append("SD at each γ on these prompts against the dev choice (read, not chosen on: the dev search "
                     "picked γ " + str(sd_gamma) + "): " + ", ".join(
                         f"`{e['run']}` {describe(e.get('vs_sd_best'))}" for e in fixed) + ".")
    inside = [e["run"] for e in evals if e["run"] != "sd" and within_noise(e.get("vs_sd_best"))]
    if inside:
        lines.append("Runs whose speed the 95 % interval cannot tell from `sd`'s: " + ", ".join(f"`{r}`" for r in inside)
                     + ".")
    return "\n\n".join(lines) + "\n"
