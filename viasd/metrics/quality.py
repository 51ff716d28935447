"""How the quality of a lossy run is judged, three ways (docs/quality.md), and the constraints a
threshold search imposes on them.

- `fidelity`: share of generated tokens equal to the target's greedy choice given the generated
  prefix (`model_metrics.teacher_forced`); with it, the target's NLL of the output;
- task quality: the task's own metric against its reference (chrF, pass@1, ...) as a *drop* in points
  against greedy `ar` on the same prompts (`task_drop`, positive = worse than `ar`);
- `agreement`: positional equality with the target's greedy output (reported; selectable).
"""

from __future__ import annotations

from dataclasses import dataclass

# metrics (besides these) that a task lists; the first other one is the task's main metric
MODEL_METRICS = ("agreement", "nll", "fidelity")
# metrics already on a 0-100 scale; every other task metric is a fraction, and a point is 0.01 of it
PERCENT_SCALE = frozenset({"chrf", "bleu"})


def main_metric(metrics: tuple[str, ...] | list[str]) -> str | None:
    """The task's own quality metric: the first listed metric that is not computed from the target."""
    return next((m for m in metrics if m not in MODEL_METRICS), None)


def points(metric: str, value: float | None) -> float | None:
    """`value` of `metric` in points (0-100)."""
    if value is None:
        return None
    return value if metric in PERCENT_SCALE else 100.0 * value


def task_drop(metric: str, ar_value: float | None, value: float | None) -> float | None:
    """Points lost against `ar` on the same prompts (negative: better than `ar`)."""
    a, b = points(metric, ar_value), points(metric, value)
    return None if a is None or b is None else a - b


@dataclass(frozen=True)
class QualityConstraints:
    """Lower/upper bounds a tuned policy must meet on the dev split; None = not constrained.

    Defaults: fidelity >= 0.95 and a task-quality drop of at most 1 point against `ar`."""

    min_fidelity: float | None = 0.95
    max_task_drop: float | None = 1.0
    min_agreement: float | None = None

    @classmethod
    def from_dict(cls, section: dict | None) -> QualityConstraints:
        return cls(**(section or {}))

    def violations(self, measured: dict) -> dict[str, float]:
        """By how much each constraint is missed (> 0 = violated; absent = met). `measured` has
        `fidelity`, `task_drop`, `agreement` (a None value cannot violate)."""
        out = {}
        for key, bound, sign in (("fidelity", self.min_fidelity, -1), ("task_drop", self.max_task_drop, 1),
                                 ("agreement", self.min_agreement, -1)):
            value = measured.get(key)
            if bound is not None and value is not None and sign * (value - bound) > 0:
                out[key] = sign * (value - bound)
        return out

    def slack(self, measured: dict) -> float:
        """Optuna constraint value: the largest normalised violation (<= 0 feasible)."""
        scale = {"fidelity": 1.0, "task_drop": 100.0, "agreement": 1.0}
        terms = []
        for key, bound, sign in (("fidelity", self.min_fidelity, -1), ("task_drop", self.max_task_drop, 1),
                                 ("agreement", self.min_agreement, -1)):
            value = measured.get(key)
            if bound is not None and value is not None:
                terms.append(sign * (value - bound) / scale[key])
        return max(terms, default=-1.0)

    def describe(self) -> str:
        parts = []
        if self.min_fidelity is not None:
            parts.append(f"fidelity >= {self.min_fidelity}")
        if self.max_task_drop is not None:
            parts.append(f"task-quality drop <= {self.max_task_drop} points")
        if self.min_agreement is not None:
            parts.append(f"agreement >= {self.min_agreement}")
        return " and ".join(parts) or "no quality constraint"
