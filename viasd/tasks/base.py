"""A task turns a data source into examples (prompt, reference) and names its stop rules and metrics.

Examples are stored as JSON lines under `data/tasks/<task>/<split>.jsonl`; `prompt_ids` is kept
when the prompt was cut from a token stream, so decoding sees exactly those ids.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from itertools import accumulate
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


def own_id(example: Example) -> str:
    """Each example its own group: examples are independent draws (HumanEval's problems, a hub dataset's rows)."""
    return example.id


def source_file(example: Example) -> str:
    """The source file an example was cut from: its id up to the first ':' (ids are `path:line` or
    `path:line:name`, paths relative and without ':')."""
    return example.id.split(":", 1)[0]


@dataclass(frozen=True)
class TaskSpec:
    name: str
    metrics: tuple[str, ...]  # metric names, see viasd.metrics
    stop_strings: tuple[str, ...] = ()
    # the unit of independence among the task's examples: examples of one group (several cuts of one source
    # file) are alike, so standard errors cluster by it and held-out prompts come from other groups
    group: Callable[[Example], str] = own_id


def examples_path(data_dir: Path, task: str, split: str) -> Path:
    return Path(data_dir) / "tasks" / task / f"{split}.jsonl"


def load_examples(data_dir: Path, task: str, split: str) -> list[Example]:
    path = examples_path(data_dir, task, split)
    if not path.exists():
        raise TaskError(f"no {split} prompts for task {task} at {path}: run `viasd prepare-data` first")
    return [Example(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def split_by_group(examples: list[Example], n: int, k: int, group: Callable[[Example], str]) -> tuple[list, list]:
    """`n` examples and `k` others from disjoint groups (`TaskSpec.group`), each side in the given order.

    The groups, in order of first appearance, are cut in two: the first s for the `n`, the rest for the `k`,
    s as near the share n / (n + k) of the groups as lets each side have enough examples (each side then
    spreads over as many groups as it can). Raises TaskError when no cut does."""
    if k == 0:
        if len(examples) < n:
            raise TaskError(f"{n} examples asked, {len(examples)} given")
        return examples[:n], []
    sizes = Counter(group(e) for e in examples)  # keys in order of first appearance
    order = list(sizes)
    before = [0, *accumulate(sizes[g] for g in order)]  # before[s]: the examples of the first s groups
    cuts = [s for s in range(1, len(order)) if before[s] >= n and len(examples) - before[s] >= k]
    if not cuts:
        raise TaskError(f"{n} + {k} examples from disjoint groups: the {len(examples)} examples of {len(order)} "
                        "group(s) have no such cut")
    share = round(len(order) * n / (n + k))
    s = min(cuts, key=lambda c: (abs(c - share), c))
    first = set(order[:s])
    return [e for e in examples if group(e) in first][:n], [e for e in examples if group(e) not in first][:k]
