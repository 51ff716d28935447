"""Tasks: how prompts, references, stop rules and metrics are made for each kind of work."""

from .base import Example, TaskError, load_examples
from .registry import get_task

__all__ = ["Example", "TaskError", "get_task", "load_examples"]
