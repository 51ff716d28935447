"""Text metrics through `evaluate`, from the local modules in `viasd/metrics/modules/`."""

from __future__ import annotations

from functools import cache
from pathlib import Path

MODULES = Path(__file__).parent / "modules"
# one directory per metric, holding <name>/<name>.py (the layout evaluate.load expects)
TEXT_METRICS = tuple(sorted(d.name for d in MODULES.iterdir() if (d / f"{d.name}.py").is_file()))


@cache
def load_metric(name: str):
    import evaluate

    if name not in TEXT_METRICS:
        raise ValueError(f"unknown text metric {name!r}; known: {', '.join(TEXT_METRICS)}")
    return evaluate.load(str(MODULES / name))


def compute(name: str, predictions: list[str], references: list) -> dict:
    return load_metric(name).compute(predictions=predictions, references=references)
