"""The study report's speed against batch size (`viasd batch-table`): the table, its plot, and a plain answer to
whether VIA-SD's gain over SD holds as the batch grows, read off the intervals of `viasd_vs_sd` per batch size."""

from __future__ import annotations

from ..bench.batch import batch_markdown
from ..metrics.speed import describe
from .drafters import verdict


def batch_answer(result: dict) -> str:
    """One sentence per ratio that matters: VIA-SD over SD and SD over `ar` at each batch size, each with its
    verdict (`pays` where the 95 % interval lies above 1, `costs` below, else `within noise`)."""
    parts = []
    for key, what in (("viasd_vs_sd", "VIA-SD over SD"), ("sd_vs_ar", "SD over ar")):
        cells = [f"batch {row['batch']}: {describe(row['ratios'].get(key))} ({verdict(row['ratios'].get(key))})"
                 for row in result["rows"] if row["ratios"].get(key)]
        if cells:
            parts.append(f"{what}: " + "; ".join(cells) + ".")
    return " ".join(parts)


def batch_section(result: dict | None, plot: str) -> list[str]:
    """The report's part for one pair and task: nothing when the table was not made or is off (`batch_table.sizes`
    empty), the reason when the pair cannot decode in batches; else the answer, the table
    (`bench.batch.batch_markdown`, its title as a sentence) and the plot (`plot`: its path relative to the summary)."""
    if result and result.get("unsupported"):
        return [f"Speed against batch size: not measured, {result['reason']}.\n"]
    if not result or result.get("off") or not result.get("rows"):
        return []
    table = batch_markdown(result, result.get("title", "speed against batch size"))
    body = table.split("\n", 2)[2] if table.startswith("# ") else table  # its own heading is the section's
    return [f"Speed against batch size ({result['prompts']} test prompts × {result['max_new_tokens']} tokens each, no "
            f"stop rule; `sd` at γ {result.get('gamma')} ({result.get('gamma_source', '–')}), `viasd` the tuned policy; "
            f"{result['repeats']} timed rounds):\n", batch_answer(result) + "\n", body, f"![batch]({plot})\n"]
