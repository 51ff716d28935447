"""Near-duplicate groups: the line test, the `together` families, and the split they produce on the
real standard library — no held-out cut of either stdlib task is mostly lines of training files."""

import pytest

from viasd import config
from viasd.data import corpus
from viasd.data.near_duplicates import GroupingParams, containment, is_copy, near_duplicate_groups, nontrivial_lines
from viasd.data.prepare import training_lines
from viasd.data.tokenizer import train_tokenizer
from viasd.tasks import builtin

MIN_JUDGED = 5
TEMPLATE = "\n".join(f"    table_entry_number_{i} = decode_value({i}, 'fixed')" for i in range(20))


def test_nontrivial_lines_skip_short_and_punctuation_lines():
    text = "x = 1\n    )\n\n    ###################\n    value = compute_something(a, b)\n"
    assert nontrivial_lines(text) == {"value = compute_something(a, b)"}


def test_a_short_copy_inside_a_long_file_is_one_group():
    long = TEMPLATE + "\n" + "\n".join(f"    other_statement_here = {i} * 1234567" for i in range(40))
    texts = {"b/long.py": long, "a/short.py": TEMPLATE, "c/unrelated.py": "print('something else entirely')\n"}
    groups = near_duplicate_groups(texts, GroupingParams(containment=0.5, min_shared=5))
    assert groups == {"a/short.py": "a/short.py", "b/long.py": "a/short.py", "c/unrelated.py": "c/unrelated.py"}
    assert containment(nontrivial_lines(TEMPLATE), nontrivial_lines(long)) == 1.0


def test_few_shared_lines_do_not_link_and_together_globs_do():
    a = "\n".join(f"    statement_of_file_a = {i} * 99999" for i in range(30)) + "\n" + TEMPLATE[:200]
    b = "\n".join(f"    statement_of_file_b = {i} * 99999" for i in range(30)) + "\n" + TEMPLATE[:200]
    texts = {"pkg/a.py": a, "pkg/b.py": b, "top.py": a}
    params = GroupingParams(containment=0.5, min_shared=5)
    groups = near_duplicate_groups(texts, params)
    assert groups["pkg/a.py"] == groups["top.py"] != groups["pkg/b.py"]
    together = near_duplicate_groups(texts, GroupingParams(containment=0.5, min_shared=5, together=("pkg/*",)))
    assert len(set(together.values())) == 1  # pkg/* is one group, and top.py joins it through a.py


def test_a_copied_reference_is_skipped():
    body = "\n".join(f"    copied_statement_number = {i} * 424242" for i in range(6))
    seen = nontrivial_lines(body)
    assert is_copy(body, seen) and not is_copy(body, frozenset(list(seen)[:4]))
    assert not is_copy("\n".join(list(seen)[:4]), seen)  # four lines: too few to call a copy


def test_large_groups_stay_in_train():
    fractions = {"train": 0.0, "calibration": 0.0, "dev": 0.0, "test": 1.0}
    params = GroupingParams(max_heldout=3)
    assert corpus.group_split("g", 3, fractions, params) == "test"
    assert corpus.group_split("g", 4, fractions, params) == "train"


def test_the_default_splits_keep_template_families_together():
    params = config.load("params.yaml")
    files = corpus.stdlib_files(params.data.split, params.data.near_duplicates)
    by_group = {}
    for f in files:
        by_group.setdefault(f.group, set()).add(f.split)
    assert all(len(splits) == 1 for splits in by_group.values())
    assert {f.split for f in files if f.path.startswith("encodings/")} == {"train"}
    assert len({f.group for f in files if f.path.startswith("encodings/")}) == 1


@pytest.fixture(scope="module")
def default_split(tmp_path_factory):
    """The default parameters' files and a BPE tokenizer trained on their train split, as prepare-data
    trains it (the tasks' cuts depend on token counts)."""
    params = config.load("params.yaml")
    files = corpus.stdlib_files(params.data.split, params.data.near_duplicates)
    tokenizer = train_tokenizer((f.text for f in files if f.split == "train"), params.data.vocab_size,
                                params.data.min_frequency, tmp_path_factory.mktemp("tokenizer"))
    return params, files, tokenizer


@pytest.mark.parametrize("split", ["dev", "test"])
def test_no_held_out_cut_is_mostly_training_lines(default_split, split):
    params, files, tokenizer = default_split
    held_out = [f for f in files if f.split == split]
    cont = params.tasks["stdlib_continuation"]
    func = params.tasks["stdlib_functions"]
    train = training_lines(f for f in files if f.split == "train")
    examples = builtin.stdlib_continuation(held_out, tokenizer, cont[f"{split}_prompts"], cont["prefix_tokens"],
                                           cont["reference_tokens"], train)
    examples += builtin.stdlib_functions(held_out, tokenizer, func[f"{split}_prompts"], func["max_prompt_tokens"],
                                         func["max_new_tokens"], train)
    assert len(examples) == cont[f"{split}_prompts"] + func[f"{split}_prompts"]
    # judged as the issue of leakage was raised, independently of `is_copy`'s constants: a reference of fewer
    # than MIN_JUDGED non-trivial lines (a two-line body: `self.destroy()`) is too short to call a copy
    shares = {e.id: containment(lines, train) for e in examples
              if len(lines := nontrivial_lines(e.reference)) >= MIN_JUDGED}
    assert len(shares) >= len(examples) // 2
    copied = {k: round(v, 2) for k, v in shares.items() if v >= 0.8}
    assert not copied, f"held-out {split} cuts with >= 80% of their reference lines in train files: {copied}"
