"""`viasd prepare-data`: the standard library's sources split into train/valid/test (by near-duplicate
group), the tokenizer, the token datasets and the DIMR calibration set (`corpus`), and each task's prompts
per split (`tasks`). Outputs under `data.dir`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..config import Params
from ..data.prepare import prepare_corpus, prepare_tasks
from ..study.record import StageRecord


def run_prepare_corpus(params: Params) -> StageRecord:
    """Write the corpus (manifest, tokenizer, token datasets, calibration set); its `StageRecord`."""
    manifest = prepare_corpus(params)
    return StageRecord(
        "prepare_data", "prepare_corpus", {"data": params.section("data")},
        {f"tokens_{k}": v for k, v in manifest["tokens"].items()} | {"vocab_size": manifest["vocab_size"]},
        {"python_version": manifest["python_version"], "pair": "-"}, [params.data.dir / "manifest.json"])


def run_prepare_tasks(params: Params, tasks: Sequence[str] | None, split: str | None) -> StageRecord:
    """Write the prompts of `tasks` (default: every task of params.yaml) for `split` (default: dev and test)."""
    splits = (split,) if split else ("dev", "test")
    written: list[Path] = prepare_tasks(params, tasks, splits)
    name = "prepare_tasks" + (f"/{'+'.join(tasks)}" if tasks else "") + (f"/{split}" if split else "")
    return StageRecord(
        "prepare_data", name, {"tasks": {t: params.tasks[t] for t in tasks or params.tasks}},
        {"examples": sum(len(p.read_text().splitlines()) for p in written)}, {"pair": "-"}, written)
