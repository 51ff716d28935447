"""Local `evaluate` module `rouge` (loadable offline: `evaluate.load(path_to_this_directory)`)."""

import datasets
import evaluate

from viasd.metrics import scoring


class Metric(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=scoring.rouge.__doc__ or "rouge",
            citation="",
            inputs_description="predictions: list of str; references: list of str",
            features=datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
        )

    def _compute(self, predictions, references):
        return scoring.rouge(list(predictions), list(references))
