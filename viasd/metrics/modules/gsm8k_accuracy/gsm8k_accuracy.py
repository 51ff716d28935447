"""Local `evaluate` module `gsm8k_accuracy` (loadable offline: `evaluate.load(path_to_this_directory)`)."""

import datasets
import evaluate

from viasd.metrics import scoring


class Metric(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=scoring.gsm8k_accuracy.__doc__ or "gsm8k_accuracy",
            citation="",
            inputs_description="predictions: list of str; references: list of str",
            features=datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
        )

    def _compute(self, predictions, references):
        return scoring.gsm8k_accuracy(list(predictions), list(references))
