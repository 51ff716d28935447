"""Local `evaluate` module `edit_sim`, loadable offline: `evaluate.load("viasd/metrics/modules/edit_sim")`."""

from viasd.metrics.module_base import scoring_metric

Metric = scoring_metric("edit_sim")
