"""The stdlib corpus: every `.py` source of the running interpreter's standard library that is not a
test, split into train / calibration / dev / test by a hash of the file's path (disjoint files)."""

from __future__ import annotations

import hashlib
import math
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "calibration", "dev", "test")
_EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the stdlib root, '/'-separated
    split: str
    sha256: str
    text: str


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(rel_path: str, fractions: dict) -> str:
    """A file's split: the first 8 bytes of sha256(path) as a number in [0, 1), against the
    cumulative fractions in SPLITS order. Depends on the path only, so it is stable across runs."""
    u = int.from_bytes(hashlib.sha256(rel_path.encode()).digest()[:8], "big") / 2**64
    edge = 0.0
    for name in SPLITS:
        edge += fractions[name]
        if u < edge:
            return name
    return SPLITS[-1]


def stdlib_files(fractions: dict, max_files: int | None = None, root: Path | None = None) -> list[SourceFile]:
    """Every non-test `.py` file under the stdlib root, sorted by path. Files that are not UTF-8 are
    skipped. `max_files` keeps about that many, each split's share (at least one file per split)
    taken in hash order, so a small corpus is an even sample of the library with every split."""
    root = root or stdlib_root()
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _EXCLUDED_DIRS & set(rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip():
            continue
        key = rel.as_posix()
        found.append(SourceFile(key, split_of(key, fractions), hashlib.sha256(text.encode()).hexdigest(), text))
    if max_files is not None:
        kept = []
        for name in SPLITS:
            members = sorted((f for f in found if f.split == name), key=lambda f: hashlib.sha256(f.path.encode()).digest())
            kept += members[: max(1, math.ceil(fractions[name] * max_files))]
        found = sorted(kept, key=lambda f: f.path)
    return found


def python_version() -> str:
    return sys.version.split()[0]
