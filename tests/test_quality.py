"""Quality three ways: fidelity counts a lossy token once; task drop in points; the constraints."""

import pytest
from conftest import PROMPTS

from viasd import DecodePolicy
from viasd.metrics.model_metrics import agreement, pooled, teacher_forced
from viasd.metrics.quality import QualityConstraints, main_metric, points, task_drop


def test_fidelity_counts_a_lossy_token_once(model_sets, tokenizer):
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    ar = models.generate(ids, DecodePolicy(method="ar", max_new_tokens=30, eos_token_ids=())).token_ids
    exact = teacher_forced(models.target, ids, ar, models.vocab_size)
    assert exact["fidelity"] == 1.0 and exact["tokens"] == 30 and exact["nll"] > 0
    # one wrong token at position 3, then the target's greedy continuation of *that* prefix
    wrong = (ar[3] + 1) % models.vocab_size
    rest = models.generate(ids + ar[:3] + [wrong], DecodePolicy(method="ar", max_new_tokens=26, eos_token_ids=()))
    lossy = ar[:3] + [wrong] + rest.token_ids
    scored = teacher_forced(models.target, ids, lossy, models.vocab_size)
    assert scored["fidelity"] == pytest.approx(29 / 30)  # one token in 30
    assert agreement(lossy, ar) < scored["fidelity"]  # positional agreement charges the whole tail
    assert teacher_forced(models.target, ids, [], models.vocab_size) is None
    both = pooled([exact, scored, None])
    assert both["tokens"] == 60 and both["fidelity"] == pytest.approx(59 / 60)


def test_task_drop_in_points():
    assert main_metric(("agreement", "nll", "chrf", "bleu")) == "chrf"
    assert main_metric(("agreement", "nll", "pass_at_1", "chrf")) == "pass_at_1"
    assert main_metric(("agreement",)) is None
    assert points("chrf", 41.5) == 41.5 and points("pass_at_1", 0.25) == 25.0
    assert task_drop("chrf", 40.0, 38.5) == pytest.approx(1.5)
    assert task_drop("pass_at_1", 0.30, 0.32) == pytest.approx(-2.0)  # better than ar
    assert task_drop("chrf", None, 3.0) is None


def test_constraints():
    c = QualityConstraints()  # fidelity >= 0.95, task drop <= 1 point
    assert c.violations({"fidelity": 0.97, "task_drop": 0.4, "agreement": 0.2}) == {}
    assert c.violations({"fidelity": 0.90, "task_drop": 2.5}) == pytest.approx({"fidelity": 0.05, "task_drop": 1.5})
    assert c.slack({"fidelity": 0.97, "task_drop": 0.0}) < 0 < c.slack({"fidelity": 0.94, "task_drop": 0.0})
    strict = QualityConstraints(min_fidelity=None, max_task_drop=None, min_agreement=0.9)
    assert strict.violations({"fidelity": 0.1, "agreement": 0.85}) == pytest.approx({"agreement": 0.05})
    assert strict.describe() == "agreement >= 0.9"
    assert QualityConstraints.from_dict(None) == c


def test_position_table_reads_pass_rates_per_position():
    from viasd.report.tables import position_table

    evals = [{"run": "viasd", "method": "viasd", "position_reached": [10, 6, 3], "position_settled": [6, 3, 0],
              "gated_rate": 0.2, "block_escalation_rate": 0.9},
             {"run": "sd", "method": "sd"}]
    table = position_table(evals)
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table.splitlines()]
    assert rows[0] == ["run", "pos 1", "pos 2", "pos 3", "blocks gated", "escalated"]
    assert ["viasd", "0.60 (10)", "0.50 (6)", "0.00 (3)", "0.200", "0.900"] in rows and not any(r[0] == "sd" for r in rows)
    assert "No VIA-SD run" in position_table([evals[1]])


def test_task_drop_standard_error_by_the_jackknife():
    """For a metric that is a mean over examples (exact match), the delete-one jackknife SE of the paired drop is
    the textbook SE of a mean difference, sd(d_i) / sqrt(n) with d_i the per-example drop in points; by source
    file (equal-sized groups) it is sd(group means) / sqrt(K); more groups than `max_blocks` are dealt into that
    many blocks; one group has no spread (None); a corpus metric (chrF) is recomputed on each subset, and
    identical outputs have SE 0."""
    import statistics

    from viasd.evaluation.side_by_side import task_drop_standard_error
    from viasd.tasks.base import Example, TaskSpec

    spec = TaskSpec("x", ("exact_match",))
    examples = [Example(id=str(i), prompt="", reference="a") for i in range(8)]
    ar = ["a", "a", "a", "b", "a", "a", "b", "a"]
    ours = ["a", "b", "b", "a", "a", "b", "a", "a"]
    d = [100.0 * ((x == "a") - (y == "a")) for x, y in zip(ar, ours)]
    assert task_drop_standard_error(spec, "exact_match", examples, ar, ours) == \
        pytest.approx(statistics.stdev(d) / len(d) ** 0.5)
    groups = [0, 0, 1, 1, 2, 2, 3, 3]
    means = [(d[2 * g] + d[2 * g + 1]) / 2 for g in range(4)]
    assert task_drop_standard_error(spec, "exact_match", examples, ar, ours, groups) == \
        pytest.approx(statistics.stdev(means) / 2)
    # 8 groups dealt round-robin into 4 blocks: the blocks {0,4}, {1,5}, {2,6}, {3,7}
    blocks = [(d[b] + d[b + 4]) / 2 for b in range(4)]
    assert task_drop_standard_error(spec, "exact_match", examples, ar, ours, max_blocks=4) == \
        pytest.approx(statistics.stdev(blocks) / 2)
    assert task_drop_standard_error(spec, "exact_match", examples, ar, ours, [0] * 8) is None
    with pytest.raises(ValueError):
        task_drop_standard_error(spec, "exact_match", examples, ar, ours[:-1])
    chrf = TaskSpec("x", ("chrf",))
    texts = [Example(id=str(i), prompt="", reference=f"def f{i}(x): return x + {i}") for i in range(5)]
    outs = ["def f0(x): return x + 0", "def f1(y): return y * 1", "lambda: 2", "def f3(x): return x - 3", "pass"]
    assert task_drop_standard_error(chrf, "chrf", texts, outs, outs) == 0.0
    assert task_drop_standard_error(chrf, "chrf", texts, [e.reference for e in texts], outs) > 0.0
