"""The cost model's per-pass costs, by runner layout and width (docs/method.md, "Threshold tuning").

A pass of a runner layout (`DecodeStats.layouts`: `target:12` is a full-model pass, `target:6` the full
model's rest after a shared trunk, `slim:0` an exit head) costs

    c(w) = per_pass + per_token * w

seconds for `w` tokens fed (rows, for an exit head): a fixed part (the weights read once, the call's
own overhead) and a part that grows with the block. The decode loop's own work outside the passes
(drafting loop, sampling, tier decisions, commits) is one more layout, `loop:<method>`, one "pass" per
call of the method's block: on a machine with a high per-op cost it is a large share of a block, and a
model of the passes alone overrates every speculative method there. Costing a pass by its layout alone charged a
7-token verification (γ = 6) the same as a 3-token one (γ = 2), and so favoured long blocks.

The two numbers are fitted per layout, by least squares weighted by pass counts, on the decoding
passes of probe decodes at every searched γ (`DecodeStats.pass_widths`), so every width a policy
runs is priced from passes of about that width. The prompt's prefill (`DecodeSession.prefill`) is
left out of both the fit and the modelled cost: it is the same for every method on a prompt (the
same layers over the same tokens) and, on a long prompt, outweighs dozens of decoding passes, so
averaging it in inflated every layout's per-pass cost by the share of prefill in the probes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from ..decoding.stats import DecodeStats

PREFILL = "prefill"


@dataclass(frozen=True)
class PassCost:
    per_pass: float  # seconds of a pass, whatever its width
    per_token: float  # seconds per token fed (row computed)

    def __call__(self, width: int) -> float:
        return self.per_pass + self.per_token * width

    def as_dict(self) -> dict:
        return asdict(self)


def split_key(key: str) -> tuple[str, str]:
    """`"target:12/5"` -> `("target:12", "5")`."""
    layout, _, width = key.rpartition("/")
    return layout, width


def decoding_passes(stats: DecodeStats | dict) -> dict[str, dict[int, tuple[int, float]]]:
    """Layout -> width -> (passes, seconds), the prefill left out. `stats`: the statistics, or their
    `as_dict()` (a decode summary read back)."""
    if isinstance(stats, dict):
        return _decoding_passes(stats["pass_widths"], stats["pass_width_s"])
    return _decoding_passes(stats.pass_widths, stats.pass_width_s)


def _decoding_passes(pass_widths: dict[str, int], pass_width_s: dict[str, float]) -> dict:
    out: dict[str, dict[int, tuple[int, float]]] = {}
    for key, n in pass_widths.items():
        layout, width = split_key(key)
        if width != PREFILL and n:
            out.setdefault(layout, {})[int(width)] = (n, pass_width_s.get(key, 0.0))
    return out


def fit_pass_costs(runs: Iterable[DecodeStats | dict]) -> dict[str, PassCost]:
    """Per layout, `per_pass` and `per_token` fitted on the decoding passes of `runs` pooled (statistics, or
    decode summaries read back).

    Least squares on the mean seconds per pass at each width, weighted by its pass count. With a single
    width (e.g. `ar`'s one-token passes), or a fit whose slope or intercept comes out negative (timing
    noise on nearly equal widths), the cost is the pooled mean per pass, flat in the width."""
    pooled: dict[str, dict[int, list]] = {}
    for stats in runs:
        for layout, widths in decoding_passes(stats).items():
            for w, (n, s) in widths.items():
                entry = pooled.setdefault(layout, {}).setdefault(w, [0, 0.0])
                entry[0] += n
                entry[1] += s
    costs = {}
    for layout, widths in pooled.items():
        n = sum(c for c, _ in widths.values())
        seconds = sum(s for _, s in widths.values())
        mean_w = sum(w * c for w, (c, _) in widths.items()) / n
        mean_t = seconds / n
        var = sum(c * (w - mean_w) ** 2 for w, (c, _) in widths.items())
        slope = sum(c * (w - mean_w) * (s / c - mean_t) for w, (c, s) in widths.items()) / var if var else 0.0
        intercept = mean_t - slope * mean_w
        if slope < 0 or intercept < 0:
            slope, intercept = 0.0, mean_t
        costs[layout] = PassCost(intercept, slope)
    return costs


def decode_seconds(stats: DecodeStats) -> float:
    """A decode's wall time without its prefill and prompt encoding (`DecodeStats.decode_time_s`): the time
    the cost model prices."""
    return stats.decode_time_s


def full_layout(costs: dict) -> str | None:
    """The unshared full-model pass among `costs`' layouts: the `target:<layers>` with the most layers
    (with reuse, `target:L-k` is only the rest after the shared trunk)."""
    return max((k for k in costs if k.startswith("target:")), key=lambda k: int(k.split(":")[1]), default=None)


def missing_layouts(stats: DecodeStats, costs: dict[str, PassCost]) -> set[str]:
    """Layouts `stats` ran in decoding passes that `costs` does not price."""
    return set(decoding_passes(stats)) - set(costs)


def widths_per_token(stats: DecodeStats | dict) -> dict[str, float]:
    """Decoding passes per generated token, by `"layout/width"`: a decode's cost under any costs. `stats`:
    the statistics, or their `as_dict()` (a decode summary read back)."""
    tokens = max(stats["new_tokens"] if isinstance(stats, dict) else stats.new_tokens, 1)
    passes = decoding_passes(stats)
    return {f"{layout}/{w}": n / tokens for layout, widths in passes.items() for w, (n, _) in widths.items()}


def cost_per_token(widths: dict[str, float], costs: dict[str, PassCost]) -> float:
    """Modelled seconds per generated token of `widths_per_token` output under `costs`."""
    total = 0.0
    for key, n in widths.items():
        layout, w = split_key(key)
        total += n * costs[layout](int(w))
    return total


def costs_from_json(raw: dict | None) -> dict[str, PassCost] | None:
    """`{layout: {per_pass, per_token}}` as written by `costs_to_json`; None for anything else (e.g. the
    flat per-pass costs an older search stored), so that they are measured again."""
    if not isinstance(raw, dict) or not all(isinstance(v, dict) and set(v) == {"per_pass", "per_token"}
                                            for v in raw.values()):
        return None
    return {k: PassCost(float(v["per_pass"]), float(v["per_token"])) for k, v in raw.items()}


def costs_to_json(costs: dict[str, PassCost]) -> dict:
    return {k: c.as_dict() for k, c in sorted(costs.items())}
