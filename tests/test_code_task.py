"""The embedded code task `stdlib_functions`: examples cut from source files, the body-end rule, and
the metrics that tell a good body from a bad one (text similarity, compiling, the doctests)."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from viasd.data.corpus import SourceFile
from viasd.evaluation.side_by_side import task_quality
from viasd.metrics import scoring
from viasd.metrics.code_checks import body_end, compiles, function_source, generated_body
from viasd.tasks import get_task
from viasd.tasks.builtin import stdlib_functions

SOURCE = '''"""A module."""
import math


def hypot2(a, b):
    """Squared length.

    >>> hypot2(3, 4)
    25
    """
    s = a * a
    s += b * b
    return s


def no_doc(x):
    return x


class Box:
    def area(self):
        """The area."""
        w = self.w
        return w * self.h

    def text(self):
        """A string with a line at column 0."""
        s = """
left"""
        return s


def tail(x):
    """Last."""
    y = x + 1
    return math.floor(y)
'''


def byte_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.add_tokens([chr(i) for i in range(32, 127)] + ["\n"])
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="\n")


def examples(n=10):
    return stdlib_functions([SourceFile("demo.py", "test", "0", SOURCE)], byte_tokenizer(), n, 2000, 200)


def test_examples_are_functions_with_docstrings_and_short_bodies():
    ex = {e.extra["name"]: e for e in examples()}
    assert set(ex) == {"hypot2", "area", "tail"}  # no docstring; a body line at column 0: left out
    h = ex["hypot2"]
    assert h.prompt.endswith('    >>> hypot2(3, 4)\n    25\n    """') and h.prompt.startswith('"""A module."""')
    assert h.reference == "    s = a * a\n    s += b * b\n    return s\n"
    assert ex["area"].extra["def_indent"] == 4 and ex["area"].reference.startswith("        w = self.w")
    assert ex["area"].extra["header"] == "def area(self):\n"
    # `demo` is no importable module, so the doctest cannot run and the example is not marked
    assert not any(e.extra["doctest"] for e in ex.values())
    assert len(examples(2)) == 2


def test_body_ends_where_the_indentation_returns():
    assert body_end("    x = 1\n\n    return x\n\n\ndef g():\n    pass\n", 0) == "    x = 1\n\n    return x\n"
    assert body_end("        return 1\n    def g(self):\n", 4) == "        return 1\n"
    assert body_end("return 1\n", 0) == ""
    # after a prompt that ends with the docstring's closing quotes, the rest of that line is not body
    assert generated_body("\n    x = 1\n    return x\ndef g():\n", 0) == "    x = 1\n    return x\n"
    assert generated_body("  # ends the line\n    return 1\n", 0) == "    return 1\n"
    assert generated_body("\n\nclass C:\n", 0) == "" and generated_body("", 4) == ""


def test_metrics_separate_a_good_body_from_a_bad_one():
    ex = examples()
    task = get_task("stdlib_functions")
    # outputs as the model writes them: the end of the docstring's line first, then the body
    perfect = [{"text": "\n" + e.reference + "\n\ndef other():\n    pass\n", "token_ids": [1]} for e in ex]
    broken = [{"text": "\n" + e.reference.splitlines(keepends=True)[0] + " " * (e.extra["def_indent"] + 4) + "x = (\n",
               "token_ids": [1]} for e in ex]
    good, bad = task_quality(task, ex, perfect), task_quality(task, ex, broken)
    assert good["chrf"] == 100.0 and good["edit_sim"] == 1.0 and good["compiles"] == 1.0
    assert bad["chrf"] < 90 and bad["edit_sim"] < 0.9 and bad["compiles"] == 0.0
    assert good["doctest_pass"] is None  # no example carries doctests that run


def test_doctests_of_a_real_stdlib_function_run_in_the_sandbox():
    from viasd.metrics.code_checks import doctest_program
    from viasd.metrics.execution import run_program

    header, doc = "def f(x):\n", '    """\n    >>> f(2)\n    4\n    """\n'
    good = function_source(header, doc, "    return x * 2\n")
    bad = function_source(header, doc, "    return x + 3\n")
    assert compiles(good) and not compiles(function_source(header, doc, "    return (\n"))
    assert run_program(doctest_program("fractions", "f", good)).passed
    assert not run_program(doctest_program("fractions", "f", bad)).passed


def test_real_stdlib_functions_with_doctests_are_checked_by_running_them():
    from viasd.data.corpus import stdlib_root

    root = stdlib_root()
    files = [SourceFile(p, "test", "0", (root / p).read_text()) for p in ("statistics.py", "textwrap.py", "fractions.py")]
    ex = stdlib_functions(files, byte_tokenizer(), 12, 4000, 400)
    assert len(ex) == 12 and len({e.id.split(":")[0] for e in ex}) == 3  # spread over the files
    marked = [e for e in ex if e.extra["doctest"]]
    assert 1 <= len(marked) <= 3  # doctest functions first, at most a quarter
    task = get_task("stdlib_functions")
    real = task_quality(task, marked, [{"text": "\n" + e.reference, "token_ids": [1]} for e in marked])
    wrong = task_quality(task, marked, [{"text": "\n" + " " * (e.extra["def_indent"] + 4) + "return None\n",
                                         "token_ids": [1]} for e in marked])
    assert real["doctest_pass"] == 1.0 and wrong["doctest_pass"] == 0.0 and wrong["compiles"] == 1.0


def test_edit_similarity():
    assert scoring.edit_sim(["abcd", "xx"], ["abcd", "yy"])["edit_sim"] == 0.5
