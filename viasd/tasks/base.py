"""A task turns a data source into examples (prompt, reference) and names its stop rules and metrics.

Examples are stored as JSON lines under `data/tasks/<task>/<split>.jsonl`; `prompt_ids` is kept
when the prompt was cut from a token stream, so decoding sees exactly those ids.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import ViasdError


class TaskError(ViasdError):
    """A task is unknown, its data cannot be loaded, or its package is missing."""


@dataclass
class Example:
    id: str
    prompt: str
    reference: str
    prompt_ids: list[int] | None = None
    extra: dict = field(default_factory=dict)  # e.g. HumanEval's test code and entry point

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TaskSpec:
    name: str
    metrics: tuple[str, ...]  # metric names, see viasd.metrics
    stop_strings: tuple[str, ...] = ()


def examples_path(data_dir: Path, task: str, split: str) -> Path:
    return Path(data_dir) / "tasks" / task / f"{split}.jsonl"


def load_examples(data_dir: Path, task: str, split: str) -> list[Example]:
    path = examples_path(data_dir, task, split)
    if not path.exists():
        raise TaskError(f"no {split} prompts for task {task} at {path}: run `viasd prepare-data` first")
    return [Example(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
