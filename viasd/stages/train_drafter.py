"""`viasd train-drafter`: the feature drafter of the default family's target (`decoding/feature_drafter.py`),
trained on the training corpus with the target frozen (`training/feature_drafter.py`). Output:
`models/<family>/feature_drafter/` (its config and weights, `training.json`), written in one rename."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..config import ConfigError, Params
from ..study.record import StageRecord

ROLE = "feature_drafter"
REPORTED = ("parameters", "steps", "train_seconds", "final_loss")


def drafter_dir(params: Params) -> Path:
    return params.model_dir(ROLE)


def run_train_drafter(params: Params, progress: bool = True, on_step: Callable | None = None
                      ) -> tuple[Path, dict, StageRecord]:
    """Train the family's feature drafter; its directory, its report and its `StageRecord`."""
    from ..io import atomic_dir, write_json
    from ..models import load_model, resolve_device
    from ..training.feature_drafter import target_continuations, train_feature_drafter
    from ..training.train import TrainingError, load_token_stream

    arch = params.family.feature_drafter
    if arch is None:
        raise ConfigError(f"models.families.{params.family.name} has no feature_drafter: set its trunk_layers, "
                          "train_tokens and lr to train one")
    target_dir = params.model_dir("target")
    if not target_dir.exists():
        raise TrainingError(f"no trained target at {target_dir}: run `viasd train-model --role target` first")
    device = resolve_device(params.device)
    target = load_model(target_dir, str(device), "float32")
    tp = params.train
    train_stream = load_token_stream(params.data.dir, "train")
    continuations = None
    if arch.continuation_windows:  # the target's own text, from a quarter-window prefix of the corpus
        continuations = target_continuations(target, train_stream, arch.continuation_windows, tp.seq_len // 4,
                                             tp.seq_len + 1, params.seed, progress=progress)
    drafter, report = train_feature_drafter(
        target, train_stream, load_token_stream(params.data.dir, "test"),
        arch.trunk_layers, train_tokens=arch.train_tokens, lr=arch.lr, ttt_steps=arch.ttt_steps,
        batch_size=tp.batch_size, seq_len=tp.seq_len, weight_decay=tp.weight_decay, grad_clip=tp.grad_clip,
        warmup_fraction=tp.warmup_fraction, precision=tp.precision, seed=params.seed, continuations=continuations,
        progress=progress, on_step=on_step)
    out = drafter_dir(params)
    report = {"role": ROLE, "family": params.family.name, **report, "device": device.type}
    with atomic_dir(out) as tmp:
        drafter.save(tmp, {"target": str(target_dir)})
        write_json(tmp / "training.json", report)
    record = StageRecord(
        "train_drafter", f"train_drafter/{params.family.name}",
        {"arch": vars(arch), "train": vars(tp), "seed": params.seed},
        {**{k: report[k] for k in REPORTED},
         **{f"test_agreement.depth_{j + 1}": a for j, a in enumerate(report["test_agreement_by_depth"])}},
        {"role": ROLE, "pair": params.family.name}, [out / "training.json"],
        None if on_step is not None else {"train_loss": report["loss_curve"]},
        inputs={"data.manifest": params.data.dir / "manifest.json"})
    return out, report, record
