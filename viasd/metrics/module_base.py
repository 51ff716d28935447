"""The one `evaluate.Metric` class behind every local metric module: each module file names the
scoring function of `viasd.metrics.scoring` it wraps."""

from __future__ import annotations

LIST_REFERENCES = {"exact_match"}  # metrics whose references are lists of acceptable answers


def scoring_metric(name: str):
    """An `evaluate.Metric` subclass computing `scoring.<name>(predictions, references)`."""
    import datasets
    import evaluate

    from . import scoring

    fn = getattr(scoring, name)
    reference = datasets.Sequence(datasets.Value("string")) if name in LIST_REFERENCES else datasets.Value("string")

    class ScoringMetric(evaluate.Metric):
        def _info(self):
            return evaluate.MetricInfo(
                description=fn.__doc__ or name,
                citation="",
                inputs_description="predictions: list of str; references: list of str (lists for exact_match)",
                features=datasets.Features({"predictions": datasets.Value("string"), "references": reference}),
            )

        def _compute(self, predictions, references):
            return fn(list(predictions), list(references))

    ScoringMetric.__name__ = ScoringMetric.__qualname__ = f"{name.title().replace('_', '')}Metric"
    return ScoringMetric
