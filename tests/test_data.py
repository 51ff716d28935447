"""prepare-data: deterministic outputs, disjoint splits, an exact tokenizer, task prompts."""

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from study_fixtures import smoke_params

from viasd import config
from viasd.data.corpus import SPLITS, group_split, stdlib_files
from viasd.data.prepare import prepare_data
from viasd.data.tokenizer import load_tokenizer
from viasd.tasks import load_examples


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("study")
    params = config.load(smoke_params(tmp))
    prepare_data(params, progress=False)
    return params


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_rerun_gives_byte_identical_outputs(prepared, tmp_path):
    params2 = config.load(smoke_params(tmp_path))
    prepare_data(params2, progress=False)
    first, second = _tree(prepared.data.dir), _tree(params2.data.dir)
    assert first.keys() == second.keys()
    assert [k for k in first if first[k] != second[k]] == []
    assert {"manifest.json", "calibration.parquet", "corpus/train.parquet", "tokenizer/tokenizer.json",
            "tasks/stdlib_continuation/dev.jsonl", "tasks/humaneval/test.jsonl"} <= set(first)


def test_task_prompts_are_prepared_apart_from_the_corpus(prepared, tmp_path):
    from viasd.data.prepare import prepare_corpus, prepare_tasks
    from viasd.tasks import TaskError

    params = config.load(smoke_params(tmp_path, {"tasks": {"stdlib_continuation": {"test_prompts": 2}}}))
    with pytest.raises(TaskError, match="run `viasd prepare-data --only corpus` first"):
        prepare_tasks(params)
    prepare_corpus(params, progress=False)
    assert not (params.data.dir / "tasks").exists()
    corpus = _tree(params.data.dir)
    assert {k: v for k, v in _tree(prepared.data.dir).items() if not k.startswith("tasks/")} == corpus
    written = prepare_tasks(params, ["stdlib_continuation"], ("test",))
    assert written == [params.data.dir / "tasks" / "stdlib_continuation" / "test.jsonl"]
    assert len(written[0].read_text().splitlines()) == 2
    assert {k for k in _tree(params.data.dir) if k.startswith("tasks/")} == {"tasks/stdlib_continuation/test.jsonl"}


def test_splits_are_disjoint_and_recorded(prepared):
    manifest = json.loads((prepared.data.dir / "manifest.json").read_text())
    assert manifest["python_version"]
    paths = {}
    for entry in manifest["files"]:
        assert entry["path"] not in paths, "a file is in two splits"
        paths[entry["path"]] = entry["split"]
        assert len(entry["sha256"]) == 64 and entry["tokens"] > 0
    assert set(paths.values()) == set(SPLITS)
    for split in SPLITS:
        table = pq.read_table(prepared.data.dir / "corpus" / f"{split}.parquet")
        assert sorted(table.column("path").to_pylist()) == sorted(p for p, s in paths.items() if s == split)
    groups = {e["path"]: e["group"] for e in manifest["files"]}
    assert all(groups[p] <= p for p in paths)  # a group's key is its smallest path
    sizes = Counter(f.group for f in stdlib_files(prepared.data.split, prepared.data.near_duplicates))
    assert all(group_split(groups[p], sizes[groups[p]], prepared.data.split, prepared.data.near_duplicates) == s
               for p, s in paths.items())
    assert not any("/test/" in f"/{p}" or p.split("/")[-1].startswith("test_") for p in paths)


def test_tokenizer_round_trips_every_test_file_exactly(prepared):
    tokenizer = load_tokenizer(prepared.data.dir / "tokenizer")
    assert len(tokenizer) == prepared.data.vocab_size
    test_files = [f for f in stdlib_files(prepared.data.split, prepared.data.near_duplicates) if f.split == "test"]
    assert len(test_files) > 20
    for f in test_files:  # every test file of the full library, not just the smoke sample
        ids = tokenizer(f.text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == f.text, f.path


def test_calibration_set(prepared):
    windows = pq.read_table(prepared.data.dir / "calibration.parquet").column("input_ids").to_pylist()
    assert len(windows) == prepared.data.calibration_sequences
    assert all(len(w) == prepared.data.calibration_length for w in windows)


def test_task_prompts(prepared):
    tokenizer = load_tokenizer(prepared.data.dir / "tokenizer")
    cfg = prepared.tasks["stdlib_continuation"]
    for split in ("dev", "test"):
        examples = load_examples(prepared.data.dir, "stdlib_continuation", split)
        assert len(examples) == cfg[f"{split}_prompts"]
        for e in examples:
            assert len(e.prompt_ids) == cfg["prefix_tokens"]
            assert tokenizer.decode(e.prompt_ids) == e.prompt and e.reference
    dev = load_examples(prepared.data.dir, "humaneval", "dev")
    test = load_examples(prepared.data.dir, "humaneval", "test")
    assert len(dev) == 4 and len(test) == 4
    assert not {e.id for e in dev} & {e.id for e in test}
    for e in dev + test:
        assert e.id.startswith("HumanEval/") and "def " in e.extra["full_prompt"] and e.extra["entry_point"]
        assert len(e.prompt_ids) <= prepared.tasks["humaneval"]["max_prompt_tokens"]


def test_outputs_are_written_atomically(prepared, tmp_path):
    """A failing run leaves no partial data directory behind (and keeps an existing one intact)."""
    from viasd.tasks import TaskError

    params = config.load(smoke_params(tmp_path, {"data": {"calibration": {"length": 10**6}}}))
    with pytest.raises(TaskError, match="calibration split has"):
        prepare_data(params, progress=False)
    assert not params.data.dir.exists()
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []
    # over an existing data directory, the failing run leaves every file as it was
    shutil.copytree(prepared.data.dir, params.data.dir)
    before = _tree(params.data.dir)
    with pytest.raises(TaskError, match="calibration split has"):
        prepare_data(params, progress=False)
    assert _tree(params.data.dir) == before
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []
