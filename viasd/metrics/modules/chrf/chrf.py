"""Local `evaluate` module `chrf`, loadable offline: `evaluate.load("viasd/metrics/modules/chrf")`."""

from viasd.metrics.module_base import scoring_metric

Metric = scoring_metric("chrf")
