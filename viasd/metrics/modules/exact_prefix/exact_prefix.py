"""Local `evaluate` module `exact_prefix` (loadable offline: `evaluate.load(path_to_this_directory)`)."""

import datasets
import evaluate

from viasd.metrics import scoring


class Metric(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=scoring.exact_prefix.__doc__ or "exact_prefix",
            citation="",
            inputs_description="predictions: list of str; references: list of str",
            features=datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
        )

    def _compute(self, predictions, references):
        return scoring.exact_prefix(list(predictions), list(references))
