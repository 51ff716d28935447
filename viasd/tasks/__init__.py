"""Tasks: how prompts, references, stop rules and metrics are made for each kind of work."""

from .base import Example, TaskError, get_task, load_examples

__all__ = ["Example", "TaskError", "get_task", "load_examples"]
