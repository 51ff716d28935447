"""Local `evaluate` module `gsm8k_accuracy`, loadable offline: `evaluate.load("viasd/metrics/modules/gsm8k_accuracy")`."""

from viasd.metrics.module_base import scoring_metric

Metric = scoring_metric("gsm8k_accuracy")
