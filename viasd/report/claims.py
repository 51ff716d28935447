"""The source's claims for VIA-SD, each beside what this study measured on its test split (one row per claim and
task, quality beside every speed figure, the 95 % intervals of `metrics.speed`).

The claims (the VIA-SD paper's abstract and results): the rejection rate falls by 0.10–0.22 against cascade SD
and Faster Cascades; VIA-SD is 10–20 % faster than the best state-of-the-art speculative decoding; 2.5–3× faster
than greedy decoding; the DIMR search takes 18–68 minutes per pair; the DIMR slim beats an independently trained
intermediate model and a random layer-skipping one.
"""

from __future__ import annotations

from pathlib import Path

from ..io import write_text
from ..metrics.speed import describe, run_vs
from ..study.cells import LOSSLESS_BASELINES
from .tables import fmt, markdown

CLAIMS = {
    "rejection": ("rejection rate below cascade SD / Faster Cascades", "0.10–0.22 lower"),
    "best_sd": ("speed over the best speculative decoding", "1.10–1.20×"),
    "greedy": ("speed over greedy decoding", "2.5–3×"),
    "dimr_time": ("DIMR search time per pair", "18–68 min"),
    "independent": ("DIMR slim against an independently trained one", "faster at equal quality"),
    "random": ("DIMR slim against a random layer skip", "faster at equal quality"),
}


def _quality(e: dict) -> str:
    q = e.get("quality") or {}
    return f"fidelity {fmt(q.get('fidelity'))}, task drop {fmt(q.get('task_drop'))}"


def best_lossless(evals: list[dict]) -> dict | None:
    """The fastest lossless speculative run on these prompts, read, not chosen on (its `vs_sd_best`; `sd` itself
    counts as 1)."""
    runs = [e for e in evals if e["method"] in LOSSLESS_BASELINES and e.get("vs_sd_best")]
    return max(runs, key=lambda e: e["vs_sd_best"]["ratio"], default=None)


def claim_rows(task: str, evals: list[dict], dimr_seconds: float | None) -> list[dict]:
    """The claims' rows for one pair and task: `evals` as `tables.with_speed` returns them (each run's
    `vs_sd_best` set); `dimr_seconds`: the pair's DIMR search wall time (Snakemake's benchmark), if known."""
    by_run = {e["run"]: e for e in evals}
    viasd = by_run.get("viasd")
    rows = []

    def row(key: str, ours: str, quality: str = "") -> None:
        claim, source = CLAIMS[key]
        rows.append({"task": task, "claim": claim, "source": source, "ours": ours, "quality": quality})

    if viasd is None:
        return rows
    for base in ("cascade_sd", "spec_cascade"):
        if base in by_run and by_run[base].get("rejection_rate") is not None and viasd.get("rejection_rate") is not None:
            drop = by_run[base]["rejection_rate"] - viasd["rejection_rate"]
            row("rejection", f"{abs(drop):.3f} {'lower' if drop >= 0 else 'higher'} than `{base}` "
                             f"({fmt(by_run[base]['rejection_rate'])} → {fmt(viasd['rejection_rate'])})", _quality(viasd))
    best = best_lossless(evals)
    if best is not None:
        # VIA-SD on the drafter of the fastest lossless SD (`viasd-drafter_self` over `sd-drafter_self`), and `viasd`
        ablation = best["run"].partition("-")[2]
        on = by_run.get(f"viasd-{ablation}") if ablation.startswith("drafter_") else None
        for run in ([on] if on is not None else []) + [viasd]:
            ratio = run_vs(best.get("speed"), run.get("speed"))
            row("best_sd", f"{describe(ratio)}: `{run['run']}` over `{best['run']}` (the fastest lossless SD here)",
                _quality(run))
    vs_ar = (viasd.get("speed") or {}).get("vs_ar")
    if vs_ar:
        row("greedy", describe(vs_ar), _quality(viasd))
    if dimr_seconds is not None:
        row("dimr_time", f"{dimr_seconds / 60:.1f} min")
    for key, run in (("independent", "viasd-independent"), ("random", "viasd-mask_random")):
        if run in by_run:
            ratio = run_vs(by_run[run].get("speed"), viasd.get("speed"))
            row(key, f"{describe(ratio)} (viasd over `{run}`)",
                f"viasd: {_quality(viasd)}; `{run}`: {_quality(by_run[run])}")
    return rows


def dimr_seconds(benchmarks: Path, pair: str) -> float | None:
    """The pair's DIMR search wall time from Snakemake's benchmark file, or None."""
    path = benchmarks / "dimr_search" / f"{pair}.tsv"
    if not path.exists():
        return None
    import pandas as pd

    bench = pd.read_csv(path, sep="\t")
    return float(bench["s"].iloc[-1]) if len(bench) and "s" in bench.columns else None


def claims_table(rows: list[dict]) -> str:
    return markdown(rows, (("task", "task"), ("claim", "claim"), ("source", "the source"), ("ours", "this study"),
                           ("quality", "quality beside it")))


def claims_section(rows: list[dict], path: Path) -> list[str]:
    """The claims table, written to `path`, and its section of the summary (empty without rows)."""
    if not rows:
        return []
    write_text(path, f"# The source's claims beside this study's test figures\n\n{claims_table(rows)}")
    return ["## The source's claims, beside this study's\n",
            "Each of the VIA-SD paper's claims with what this study measured on the test split (read, not chosen on); "
            "\"the best speculative decoding\" is the fastest lossless run of this grid on these prompts.\n",
            claims_table(rows)]
