"""The scoring functions behind the local `evaluate` modules (pure functions of strings)."""

from __future__ import annotations

import re
import string


def rouge(predictions: list[str], references: list[str]) -> dict:
    from rouge_score import rouge_scorer, scoring

    kinds = ["rouge1", "rouge2", "rougeL", "rougeLsum"]
    scorer = rouge_scorer.RougeScorer(kinds, use_stemmer=False)
    agg = scoring.BootstrapAggregator()
    for pred, ref in zip(predictions, references):
        agg.add_scores(scorer.score(ref, pred))
    result = agg.aggregate()
    return {k: float(result[k].mid.fmeasure) for k in kinds}


def bleu(predictions: list[str], references: list[str]) -> dict:
    import sacrebleu

    return {"bleu": float(sacrebleu.corpus_bleu(predictions, [references]).score)}


def chrf(predictions: list[str], references: list[str]) -> dict:
    import sacrebleu

    return {"chrf": float(sacrebleu.corpus_chrf(predictions, [references]).score)}


def edit_sim(predictions: list[str], references: list[str]) -> dict:
    """Mean edit similarity of each prediction to its reference, in [0, 1]: difflib's
    `SequenceMatcher.ratio` (2 * matched characters / total characters), the "edit sim" of code
    completion benchmarks (CodeXGLUE, RepoBench)."""
    from difflib import SequenceMatcher

    scores = [SequenceMatcher(None, p, r, autojunk=False).ratio() for p, r in zip(predictions, references)]
    return {"edit_sim": sum(scores) / max(len(scores), 1)}


def normalize_answer(text: str) -> str:
    """SQuAD-style: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(predictions: list[str], references: list[list[str]]) -> dict:
    hits = [any(normalize_answer(p) == normalize_answer(r) for r in refs) for p, refs in zip(predictions, references)]
    return {"exact_match": sum(hits) / max(len(hits), 1)}


def gsm8k_accuracy(predictions: list[str], references: list[str]) -> dict:
    from ..tasks.hub import gsm8k_final_answer

    def same(a, b):
        if a is None or b is None:
            return False
        try:
            return abs(float(a) - float(b)) < 1e-6
        except ValueError:
            return a == b

    hits = [same(gsm8k_final_answer(p), gsm8k_final_answer(r)) for p, r in zip(predictions, references)]
    return {"gsm8k_accuracy": sum(hits) / max(len(hits), 1)}


def exact_prefix(predictions: list[str], references: list[str]) -> dict:
    """Mean share of the reference's characters reproduced exactly from its start (continuations)."""
    shares = []
    for pred, ref in zip(predictions, references):
        n = 0
        for a, b in zip(pred, ref):
            if a != b:
                break
            n += 1
        shares.append(n / max(len(ref), 1))
    return {"exact_prefix": sum(shares) / max(len(shares), 1)}
