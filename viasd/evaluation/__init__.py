"""Decoding a task's prompts with several policies side by side with greedy `ar` (`side_by_side`), in the
balanced order every timed comparison uses (`run_order`), and the task quality every run reports."""

MOVED = ("decode_side_by_side", "metric_score", "task_quality", "task_drop_standard_error")


def __getattr__(name: str):
    """`viasd.evaluation.<name>` of the module this package replaced: still there, with a DeprecationWarning."""
    if name in MOVED:
        import warnings

        from . import side_by_side

        warnings.warn(f"viasd.evaluation.{name} moved to viasd.evaluation.side_by_side.{name}", DeprecationWarning,
                      stacklevel=2)
        return getattr(side_by_side, name)
    raise AttributeError(f"module 'viasd.evaluation' has no attribute {name!r}")
