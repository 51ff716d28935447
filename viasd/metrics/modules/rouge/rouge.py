"""Local `evaluate` module `rouge`, loadable offline: `evaluate.load("viasd/metrics/modules/rouge")`."""

from viasd.metrics.module_base import scoring_metric

Metric = scoring_metric("rouge")
