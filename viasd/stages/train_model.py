"""`viasd train-model`: one model of the default family (target, draft or independent), trained on the corpus
from scratch or from its last checkpoint. Outputs: `models/<family>/<role>/` (safetensors, tokenizer,
`training.json`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..config import Params
from ..study.record import StageRecord
from ..training.train import train_with_report

REPORTED = ("parameters", "steps", "train_seconds", "tokens_per_second", "test_nll", "test_perplexity", "final_loss")


def run_train_model(params: Params, role: str, on_step: Callable | None = None) -> tuple[Path, dict, StageRecord]:
    """Train `role`; its directory, its training report and its `StageRecord`. `on_step(step, loss)` logs the
    loss while training runs, so with one the record leaves the loss curve out."""
    out, report = train_with_report(params, role, on_step=on_step)
    record = StageRecord(
        "train_model", f"train_model/{role}",
        {"arch": vars(params.family.arch(role)), "train": vars(params.train), "seed": params.seed},
        {k: report[k] for k in REPORTED},
        {"role": role, "pair": params.family.name}, [out / "training.json"],
        None if on_step is not None else {"train_loss": report["loss_curve"]},
        inputs={"data.manifest": params.data.dir / "manifest.json"})
    return out, report, record
