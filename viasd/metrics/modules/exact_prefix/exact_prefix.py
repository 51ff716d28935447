"""Local `evaluate` module `exact_prefix`, loadable offline: `evaluate.load("viasd/metrics/modules/exact_prefix")`."""

from viasd.metrics.module_base import scoring_metric

Metric = scoring_metric("exact_prefix")
