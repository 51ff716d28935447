"""Wall time per workflow rule, summed from Snakemake's `benchmarks/` files."""

from __future__ import annotations

from pathlib import Path

from ..config import Params
from ..io import write_text
from .tables import markdown


def stage_times(benchmarks: Path) -> str | None:
    """Wall time per rule (sum and count of its jobs) from Snakemake's `benchmark:` files, or None."""
    files = sorted(benchmarks.rglob("*.tsv")) if benchmarks.is_dir() else []
    totals: dict[str, list[float]] = {}
    import pandas as pd

    for f in files:
        bench = pd.read_csv(f, sep="\t")
        if len(bench) and "s" in bench.columns:
            rule = f.relative_to(benchmarks).parts[0].removesuffix(".tsv")
            totals.setdefault(rule, []).append(float(bench["s"].iloc[-1]))
    if not totals:
        return None
    rows = [{"rule": rule, "jobs": len(secs), "sum": f"{sum(secs):.0f}", "longest": f"{max(secs):.0f}"}
            for rule, secs in sorted(totals.items(), key=lambda kv: -sum(kv[1]))]
    rows.append({"rule": "all", "jobs": sum(map(len, totals.values())), "sum": f"{sum(map(sum, totals.values())):.0f}",
                 "longest": ""})
    return markdown(rows, (("rule", "rule"), ("jobs", "jobs"), ("sum", "wall s (sum)"), ("longest", "longest job s")))


def stage_times_section(params: Params, paths: dict) -> list[str]:
    """The stage-times table (written to its own file) and its summary section; empty without benchmarks."""
    times = stage_times(params.models_dir.parent / "benchmarks")
    if not times:
        return []
    side_by_side = "Jobs whose threads fit in `--cores` run side by side, so the sums can exceed the study's wall time."
    write_text(paths["stage-times"], f"# Wall time per workflow rule (Snakemake benchmarks/)\n\n{side_by_side}\n\n{times}")
    return ["## Stage times\n", "Wall time per workflow rule, from Snakemake's `benchmarks/` (the report's own job is "
            f"not yet in it). {side_by_side} Machines of one kind differ in speed from day to day: the family table's "
            "training steps/s (the target's above all) is this run's gauge.\n", times]
