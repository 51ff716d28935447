"""Local `evaluate` module `exact_match` (loadable offline: `evaluate.load(path_to_this_directory)`)."""

import datasets
import evaluate

from viasd.metrics import scoring


class Metric(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=scoring.exact_match.__doc__ or "exact_match",
            citation="",
            inputs_description="predictions: list of str; references: list of str",
            features=datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}),
        )

    def _compute(self, predictions, references):
        return scoring.exact_match(list(predictions), list(references))
