"""Local `evaluate` module `exact_match`, loadable offline: `evaluate.load("viasd/metrics/modules/exact_match")`."""

from viasd.metrics.module_base import scoring_metric

Metric = scoring_metric("exact_match")
