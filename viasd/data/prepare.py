"""`viasd prepare-data`: corpus splits, tokenizer, token datasets, calibration set, task prompts.

Two parts, so that what training reads does not depend on the tasks: `--only corpus` (the first four
outputs below) and `--only tasks` (the prompts, one file per task and split; `--task`, `--split`).
Outputs under `data.dir` (all deterministic for one interpreter: re-running gives identical bytes):
  manifest.json              python version, every file with its split, near-duplicate group, sha256 and
                             token count
  tokenizer/                 the byte-level BPE tokenizer (load with AutoTokenizer)
  corpus/<split>.parquet     one row per file: path, input_ids (EOS-terminated)
  calibration.parquet        `sequences` windows of `length` tokens from the calibration split
  tasks/<task>/<split>.jsonl prompts and references for dev and test
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from pathlib import Path

from ..config import Params
from ..io import replace_path, write_json, write_jsonl
from ..tasks.base import TaskError
from . import corpus as corpus_mod
from .near_duplicates import nontrivial_lines
from .tokenizer import load_tokenizer, train_tokenizer

log = logging.getLogger(__name__)


def _write_parquet(path: Path, columns: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(columns)
    pq.write_table(table, path, compression="zstd", write_statistics=False)


def calibration_windows(token_lists: list[list[int]], sequences: int, length: int, seed: int) -> list[list[int]]:
    """`sequences` windows of `length` tokens, at offsets chosen by hash (deterministic)."""
    stream = [t for ids in token_lists for t in ids]
    if len(stream) < length:
        raise TaskError(f"the calibration split has {len(stream)} tokens, fewer than one window of {length}; "
                        "raise data.split.calibration or lower data.calibration.length")
    span = len(stream) - length
    windows = []
    for i in range(sequences):
        h = int.from_bytes(hashlib.sha256(f"{seed}:{i}".encode()).digest()[:8], "big")
        start = h % (span + 1)
        windows.append(stream[start : start + length])
    return windows


CORPUS_OUTPUTS = ("tokenizer", "corpus", "calibration.parquet", "manifest.json")


def _split_files(params: Params) -> dict:
    files = corpus_mod.stdlib_files(params.data.split, params.data.near_duplicates, params.data.max_files)
    by_split = {s: [f for f in files if f.split == s] for s in corpus_mod.SPLITS}
    for split, members in by_split.items():
        if not members:
            raise TaskError(f"the {split} split has no files; raise data.split.{split} or data.max_files")
    return by_split


def prepare_corpus(params: Params, progress: bool = True) -> dict:
    """The tokenizer, the token datasets, the calibration set and the manifest (what training and the
    mask search read; no task prompt). Each output replaces its predecessor in one rename; the manifest
    goes last. Returns the manifest (`data.dir/manifest.json`)."""
    from tqdm.auto import tqdm

    out_dir = params.data.dir
    by_split = _split_files(params)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out_dir.name}.corpus.", dir=out_dir.parent) as tmp_name:
        tmp = Path(tmp_name)
        log.info("training a %d-token BPE tokenizer on %d train files", params.data.vocab_size, len(by_split["train"]))
        train_tokenizer((f.text for f in by_split["train"]), params.data.vocab_size, params.data.min_frequency,
                        tmp / "tokenizer")
        tokenizer = load_tokenizer(tmp / "tokenizer")
        eos = tokenizer.eos_token_id
        (tmp / "corpus").mkdir()
        manifest_files, tokens_by_split = [], {}
        for split in corpus_mod.SPLITS:
            ids_list = []
            for f in tqdm(by_split[split], desc=f"tokenizing {split}", disable=not progress, leave=False):
                ids = tokenizer(f.text, add_special_tokens=False)["input_ids"] + [eos]
                ids_list.append(ids)
                manifest_files.append({"path": f.path, "split": split, "group": f.group, "sha256": f.sha256,
                                       "tokens": len(ids)})
            tokens_by_split[split] = ids_list
            _write_parquet(tmp / "corpus" / f"{split}.parquet",
                           {"path": [f.path for f in by_split[split]], "input_ids": ids_list})
        windows = calibration_windows(tokens_by_split["calibration"], params.data.calibration_sequences,
                                      params.data.calibration_length, params.seed)
        _write_parquet(tmp / "calibration.parquet", {"input_ids": windows})
        manifest = {
            "python_version": corpus_mod.python_version(),
            "split_fractions": params.data.split,
            "vocab_size": len(tokenizer),
            "tokens": {s: sum(map(len, tokens_by_split[s])) for s in corpus_mod.SPLITS},
            "files": manifest_files,
        }
        write_json(tmp / "manifest.json", manifest)
        out_dir.mkdir(exist_ok=True)
        (out_dir / "manifest.json").unlink(missing_ok=True)  # no manifest: an unfinished corpus
        for name in CORPUS_OUTPUTS:  # manifest.json last: its presence marks a finished corpus
            replace_path(tmp / name, out_dir / name)
    return manifest


def training_lines(train_files) -> frozenset[str]:
    """The non-trivial lines of the training files: a held-out example made of them is a copy."""
    return frozenset().union(*(nontrivial_lines(f.text) for f in train_files))


def prepare_tasks(params: Params, tasks: list[str] | None = None, splits: tuple[str, ...] = ("dev", "test")) -> list[Path]:
    """The prompts and references of `tasks` (default: every task under `tasks:`) for `splits`, one
    file per task and split (`tasks/<task>/<split>.jsonl`), built with the prepared tokenizer; a
    change to one task's test prompts rewrites that file only."""
    from ..tasks import builtin, hub
    from ..tasks.base import examples_path

    tok_dir = params.data.dir / "tokenizer"
    if not (params.data.dir / "manifest.json").exists():
        raise TaskError(f"no prepared corpus in {params.data.dir}: run `viasd prepare-data --only corpus` first")
    tokenizer = load_tokenizer(tok_dir)
    names = list(params.tasks) if tasks is None else tasks
    for name in names:
        if name not in params.tasks:
            raise TaskError(f"task {name!r} has no entry under tasks in the parameters")
    by_split = _split_files(params) if any(n.startswith("stdlib_") for n in names) else {}
    seen = training_lines(by_split["train"]) if by_split else frozenset()
    written = []
    for name in names:
        cfg = params.tasks[name]
        for split in splits:
            n = cfg.get(f"{split}_prompts", 16)
            if name == "stdlib_continuation":
                examples = builtin.stdlib_continuation(by_split[split], tokenizer, n, cfg.get("prefix_tokens", 128),
                                                       cfg.get("reference_tokens", 128), seen)
            elif name == "stdlib_functions":
                examples = builtin.stdlib_functions(by_split[split], tokenizer, n, cfg.get("max_prompt_tokens", 384),
                                                    cfg.get("max_new_tokens", 128), seen)
            elif name == "humaneval":
                examples = builtin.humaneval(tokenizer, split, cfg.get("dev_prompts", 16),
                                             cfg.get("test_prompts", 64), cfg.get("max_prompt_tokens", 384))
            else:
                examples = hub.hub_examples(name, split, n, cfg.get("source"), cfg.get("template"))
            path = examples_path(params.data.dir, name, split)
            write_jsonl(path, [e.to_json() for e in examples])
            written.append(path)
    return written


def prepare_data(params: Params, progress: bool = True) -> Path:
    """The corpus, then every task's prompts (`prepare_corpus` + `prepare_tasks`)."""
    prepare_corpus(params, progress)
    prepare_tasks(params)
    return params.data.dir
