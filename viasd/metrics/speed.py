"""Speed ratios with intervals: the geometric mean of per-prompt paired ratios, clustered by source file.

A run's speed on one prompt is its decode time per generated token (`DecodeStats.decode_seconds_per_token`:
the wall time without the prompt's prefill and encoding). Two runs decoded side by side on the same prompts
give one paired ratio per prompt, `r_i = t_base,i / t_ours,i` (> 1: ours is faster). The headline ratio is
their geometric mean, `exp(mean_i log r_i)`: a per-prompt summary that neither a long output nor a long
prompt dominates (the ratio of summed times weights each prompt by its length and its prefill).

Prompts cut from one source file are alike, so the interval treats files, not prompts, as independent:
with `l_i = log r_i`, `l_bar` their mean over `n` prompts and `G` files, the cluster-robust variance of
`l_bar` is

    Var = G / (G - 1) * sum_g (sum_{i in g} (l_i - l_bar))^2 / n^2,

and the 95 % interval is `exp(l_bar +- t_{G-1, 0.975} * sqrt(Var))` (Student's t with G - 1 degrees of
freedom, the usual small-cluster correction). With one prompt per file it is the ordinary paired interval.
Rounds of a benchmark over the same prompts are averaged per prompt first (`mean_over_rounds`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

CONFIDENCE = 0.95


def seconds_per_token(stats: dict) -> float | None:
    """A decode row's decode time per generated token (`DecodeStats.as_dict()`), None without tokens."""
    if not stats.get("new_tokens"):
        return None
    seconds = stats.get("decode_time_s")
    if seconds is None:  # a row decoded before the prefill was timed apart: its wall time
        seconds = stats["wall_time_s"]
    return seconds / stats["new_tokens"] if seconds > 0 else None


def paired_ratio(base: Sequence[float | None], ours: Sequence[float | None], groups: Sequence | None = None,
                 confidence: float = CONFIDENCE) -> dict | None:
    """`base` over `ours` per prompt (seconds per token of each, aligned; a None pairs out its prompt), as
    the geometric mean with its interval clustered by `groups` (aligned; None: each prompt its own).

    Returns `{ratio, low, high, prompts, groups}` (`low`/`high` None with fewer than two groups), or None
    when no prompt pairs."""
    from scipy.stats import t as student_t

    if len(base) != len(ours) or (groups is not None and len(groups) != len(base)):
        raise ValueError(f"{len(base)} base and {len(ours)} paired values, {len(groups or base)} groups")
    groups = list(range(len(base))) if groups is None else list(groups)
    pairs = [(math.log(b / o), g) for b, o, g in zip(base, ours, groups) if b and o and b > 0 and o > 0]
    if not pairs:
        return None
    n = len(pairs)
    mean = sum(v for v, _ in pairs) / n
    sums: dict = {}
    for v, g in pairs:
        sums[g] = sums.get(g, 0.0) + (v - mean)
    k = len(sums)
    out = {"ratio": math.exp(mean), "low": None, "high": None, "prompts": n, "groups": k}
    if k >= 2:
        se = math.sqrt(k / (k - 1) * sum(s * s for s in sums.values()) / n**2)
        half = student_t.ppf(0.5 + confidence / 2, k - 1) * se
        out.update(low=math.exp(mean - half), high=math.exp(mean + half))
    return out


def mean_over_rounds(rounds: Sequence[Sequence[float]]) -> list[float]:
    """Per prompt, the geometric mean of its seconds per token over benchmark rounds (`rounds[r][i]`)."""
    return [math.exp(sum(math.log(r[i]) for r in rounds) / len(rounds)) for i in range(len(rounds[0]))]


def within_noise(ratio: dict | None) -> bool | None:
    """Whether the interval holds 1 (no difference shown); None without an interval."""
    if ratio is None or ratio.get("low") is None:
        return None
    return ratio["low"] <= 1.0 <= ratio["high"]


def describe(ratio: dict | None, digits: int = 3) -> str:
    """`1.234× [1.101, 1.380]` (or `1.234×` without an interval, `–` without a ratio)."""
    if ratio is None:
        return "–"
    text = f"{ratio['ratio']:.{digits}f}×"
    if ratio.get("low") is not None:
        text += f" [{ratio['low']:.{digits}f}, {ratio['high']:.{digits}f}]"
    return text


def run_vs(base: dict, ours: dict) -> dict | None:
    """The paired ratio of two evaluated runs' `speed` records (`evaluate_stage.run_speed`), prompts matched by
    id: base's seconds per token over ours', clustered by ours' source-file groups."""
    if not base or not ours:
        return None
    theirs = dict(zip(base["ids"], base["seconds_per_token"]))
    ids = [i for i in ours["ids"] if i in theirs]
    own = dict(zip(ours["ids"], ours["seconds_per_token"]))
    groups = dict(zip(ours["ids"], ours["groups"]))
    return paired_ratio([theirs[i] for i in ids], [own[i] for i in ids], [groups[i] for i in ids])
