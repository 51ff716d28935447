"""Near-duplicate groups of source files, so that a split never puts one template on both sides.

The standard library holds families of generated or copied modules (the charmap codecs of
`encodings/`, the CJK codecs, `lib2to3`'s fixers, …). Split file by file, such a family lands in train
and in test at once, and a held-out cut is then mostly lines the models were trained on: the cuts where
every model agrees and speculation pays most. So files are grouped first and a whole group takes one
split.

Two files are linked when they share at least `min_shared` *non-trivial lines* (a stripped line of at
least `MIN_LINE_CHARS` characters with a letter or digit in it) and the shared lines are at least
`containment` of the smaller file's non-trivial lines (containment, not Jaccard: a short template
instance inside a long one is still a copy). Groups are the connected components of those links, plus
every file matched by one of the `together` glob patterns, which forms one group per pattern (a family
that the line test splits into several, as the charmap and the CJK codecs are, is still one family).
"""

from __future__ import annotations

import fnmatch
from collections import Counter, defaultdict
from dataclasses import dataclass

MIN_LINE_CHARS = 12
# a line in more files than this is boilerplate (`from __future__ import annotations`): it never links
# files by itself, and leaving it out keeps the pair count near linear in the corpus
MAX_LINE_FILES = 400


@dataclass(frozen=True)
class GroupingParams:
    """`data.near_duplicates` in the parameters."""

    containment: float = 0.25
    min_shared: int = 5
    together: tuple[str, ...] = ()
    max_heldout: int = 8  # a larger group is kept in train (see `assign_group_splits`)


def nontrivial_lines(text: str) -> frozenset[str]:
    """The stripped lines of `text` long enough to say something about where the file came from."""
    return frozenset(s for s in (line.strip() for line in text.splitlines())
                     if len(s) >= MIN_LINE_CHARS and any(c.isalnum() for c in s))


def containment(part: frozenset[str], whole: frozenset[str]) -> float:
    """The share of `part`'s lines that are in `whole` (0 for an empty `part`)."""
    return len(part & whole) / len(part) if part else 0.0


class _UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def near_duplicate_groups(texts: dict[str, str], params: GroupingParams) -> dict[str, str]:
    """Each path of `texts` (path -> source) mapped to its group's key: the group's smallest path.

    Deterministic in the set of files: paths are processed sorted, and the key does not depend on the
    order links were found in."""
    paths = sorted(texts)
    lines = [nontrivial_lines(texts[p]) for p in paths]
    by_line: dict[str, list[int]] = defaultdict(list)
    for i, ls in enumerate(lines):
        for line in ls:
            by_line[line].append(i)
    shared: Counter = Counter()
    for members in by_line.values():
        if 2 <= len(members) <= MAX_LINE_FILES:
            for k, a in enumerate(members):
                for b in members[k + 1:]:
                    shared[a, b] += 1
    groups = _UnionFind(len(paths))
    for (a, b), n in shared.items():
        if n >= params.min_shared and n >= params.containment * min(len(lines[a]), len(lines[b])):
            groups.union(a, b)
    for pattern in params.together:
        matched = [i for i, p in enumerate(paths) if fnmatch.fnmatchcase(p, pattern)]
        for i in matched[1:]:
            groups.union(matched[0], i)
    return {p: paths[groups.find(i)] for i, p in enumerate(paths)}


def group_sizes(groups: dict[str, str]) -> Counter:
    """Files per group key."""
    return Counter(groups.values())


# a held-out example whose reference has at least COPY_MIN_LINES non-trivial lines, COPY_SHARE of them found
# verbatim in training files, is a copy the file groups missed (a function copied from another module:
# distutils.spawn.find_executable from shutil.which); the tasks skip it. Fewer lines are too few to call a copy
COPY_SHARE = 0.8
COPY_MIN_LINES = 5


def is_copy(reference: str, seen_lines: frozenset[str]) -> bool:
    """Whether `reference` is mostly lines of the training files (`seen_lines`: their non-trivial lines)."""
    lines = nontrivial_lines(reference)
    return len(lines) >= COPY_MIN_LINES and containment(lines, seen_lines) >= COPY_SHARE
