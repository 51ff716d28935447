"""The stdlib corpus: every `.py` source of the running interpreter's standard library that is not a
test, split into train / calibration / dev / test by a hash of the file's near-duplicate group (disjoint
files, and no template family on two sides: `near_duplicates`)."""

from __future__ import annotations

import hashlib
import math
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from .near_duplicates import GroupingParams, group_sizes, near_duplicate_groups

SPLITS = ("train", "calibration", "dev", "test")
_EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the stdlib root, '/'-separated
    split: str
    sha256: str
    text: str
    group: str = ""  # the near-duplicate group's key (its smallest path); "" for a file built by hand


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(rel_path: str, fractions: dict) -> str:
    """A group's split: the first 8 bytes of sha256(key) as a number in [0, 1), against the
    cumulative fractions in SPLITS order. Depends on the key only, so it is stable across runs."""
    u = int.from_bytes(hashlib.sha256(rel_path.encode()).digest()[:8], "big") / 2**64
    edge = 0.0
    for name in SPLITS:
        edge += fractions[name]
        if u < edge:
            return name
    return SPLITS[-1]


def group_split(key: str, size: int, fractions: dict, grouping: GroupingParams) -> str:
    """The split of a near-duplicate group of `size` files keyed `key`: by hash, except that a group of
    more than `grouping.max_heldout` files goes to train. Held out, such a family would be one module
    many times over in a split of a few dozen files (the charmap codecs alone are ~100 files)."""
    return "train" if size > grouping.max_heldout else split_of(key, fractions)


def stdlib_files(fractions: dict, grouping: GroupingParams, max_files: int | None = None,
                 root: Path | None = None) -> list[SourceFile]:
    """Every non-test `.py` file under the stdlib root, sorted by path, each with the split of its
    near-duplicate group (grouped over the whole library, before any sampling). Files that are not
    UTF-8 are skipped. `max_files` keeps about that many, each split's share (at least one file per
    split) taken in hash order, so a small corpus is an even sample of the library with every split."""
    root = root or stdlib_root()
    texts = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _EXCLUDED_DIRS & set(rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            texts[rel.as_posix()] = text
    groups = near_duplicate_groups(texts, grouping)
    sizes = group_sizes(groups)
    found = [SourceFile(key, group_split(groups[key], sizes[groups[key]], fractions, grouping),
                        hashlib.sha256(text.encode()).hexdigest(), text, groups[key])
             for key, text in texts.items()]
    if max_files is not None:
        kept = []
        for name in SPLITS:
            members = sorted((f for f in found if f.split == name), key=lambda f: hashlib.sha256(f.path.encode()).digest())
            kept += members[: max(1, math.ceil(fractions[name] * max_files))]
        found = sorted(kept, key=lambda f: f.path)
    return found


def python_version() -> str:
    return sys.version.split()[0]
