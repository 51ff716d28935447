"""Local `evaluate` module `chrf` (loadable offline: `evaluate.load(path_to_this_directory)`)."""

import datasets
import evaluate

from viasd.metrics import scoring


class Metric(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=scoring.chrf.__doc__ or "chrf",
            citation="",
            inputs_description="predictions: list of str; references: list of str",
            features=datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
        )

    def _compute(self, predictions, references):
        return scoring.chrf(list(predictions), list(references))
