"""Every task the study knows, by name: the built-in ones (the embedded stdlib tasks, HumanEval) and the
hub datasets."""

from __future__ import annotations

from .base import TaskError, TaskSpec
from .builtin import BUILTIN
from .hub import HUB_TASKS


def get_task(name: str) -> TaskSpec:
    if name in BUILTIN:
        return BUILTIN[name]
    if name in HUB_TASKS:
        return HUB_TASKS[name].spec
    known = ", ".join([*BUILTIN, *HUB_TASKS])
    raise TaskError(f"unknown task {name!r}; known tasks: {known}")
