"""Local `evaluate` module `bleu`, loadable offline: `evaluate.load("viasd/metrics/modules/bleu")`."""

from viasd.metrics.module_base import scoring_metric

Metric = scoring_metric("bleu")
