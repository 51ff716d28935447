"""`viasd prepare-data`: corpus splits, tokenizer, token datasets, calibration set, task prompts.

Outputs under `data.dir` (all deterministic for one interpreter: re-running gives identical bytes):
  manifest.json              python version, every file with its split, sha256 and token count
  tokenizer/                 the byte-level BPE tokenizer (load with AutoTokenizer)
  corpus/<split>.parquet     one row per file: path, input_ids (EOS-terminated)
  calibration.parquet        `sequences` windows of `length` tokens from the calibration split
  tasks/<task>/<split>.jsonl prompts and references for dev and test
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from ..config import Params
from ..io import atomic_dir, write_json, write_jsonl
from ..tasks.base import TaskError
from . import corpus as corpus_mod
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


def prepare_data(params: Params, progress: bool = True) -> Path:
    from tqdm.auto import tqdm

    from ..tasks import builtin, hub

    out_dir = params.data.dir
    files = corpus_mod.stdlib_files(params.data.split, params.data.max_files)
    by_split = {s: [f for f in files if f.split == s] for s in corpus_mod.SPLITS}
    for split, members in by_split.items():
        if not members:
            raise TaskError(f"the {split} split has no files; raise data.split.{split} or data.max_files")
    with atomic_dir(out_dir) as tmp:
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
                manifest_files.append({"path": f.path, "split": split, "sha256": f.sha256, "tokens": len(ids)})
            tokens_by_split[split] = ids_list
            _write_parquet(tmp / "corpus" / f"{split}.parquet",
                           {"path": [f.path for f in by_split[split]], "input_ids": ids_list})
        windows = calibration_windows(tokens_by_split["calibration"], params.data.calibration_sequences,
                                      params.data.calibration_length, params.seed)
        _write_parquet(tmp / "calibration.parquet", {"input_ids": windows})
        for name, cfg in params.tasks.items():
            for split in ("dev", "test"):
                n = cfg.get(f"{split}_prompts", 16)
                if name == "stdlib_continuation":
                    examples = builtin.stdlib_continuation(by_split[split], tokenizer, n, cfg.get("prefix_tokens", 128),
                                                           cfg.get("reference_tokens", 128))
                elif name == "stdlib_functions":
                    examples = builtin.stdlib_functions(by_split[split], tokenizer, n, cfg.get("max_prompt_tokens", 384),
                                                        cfg.get("max_new_tokens", 128))
                elif name == "humaneval":
                    examples = builtin.humaneval(tokenizer, split, cfg.get("dev_prompts", 16),
                                                 cfg.get("test_prompts", 64), cfg.get("max_prompt_tokens", 384))
                else:
                    examples = hub.hub_examples(name, split, n, cfg.get("source"))
                write_jsonl(tmp / "tasks" / name / f"{split}.jsonl", [e.to_json() for e in examples])
        write_json(tmp / "manifest.json", {
            "python_version": corpus_mod.python_version(),
            "split_fractions": params.data.split,
            "vocab_size": len(tokenizer),
            "tokens": {s: sum(map(len, tokens_by_split[s])) for s in corpus_mod.SPLITS},
            "files": manifest_files,
        })
    return out_dir
