"""Pluggable tier rules of VIA-SD (docs/method.md (the tiers)).

A *score* says how well the draft token `x_i` is supported by a slim verifier (tier 1, direct
acceptance when `s_i >= tau_accept`; in sampling mode a probabilistic score accepts with probability
`min(1, s_i / tau_accept)`). A *confidence* says whether the slim verifier is sure enough of its own
choice at position `i` to regenerate the token there (tier 2, when `c_i >= tau_slim`).
Higher is always better. Shapes: `q_slim`, `p`: `[g, V]` probabilities at the block's `g` positions
(`q'_i`, `p_i`), `x`: `[g]` draft tokens; every function returns `[g]`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

_EPS = 1e-12


def _at(probs: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return probs.gather(-1, x.unsqueeze(-1)).squeeze(-1)


def _neg_entropy(q: torch.Tensor) -> torch.Tensor:
    return (q * q.clamp_min(_EPS).log()).sum(-1)


@dataclass(frozen=True)
class Score:
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    probabilistic: bool  # a non-negative score usable as min(1, s / tau) in sampling mode
    doc: str


@dataclass(frozen=True)
class Confidence:
    fn: Callable[[torch.Tensor], torch.Tensor]
    doc: str


def _ratio(q, p, x):
    return _at(q, x) / _at(p, x).clamp_min(_EPS)


def _ratio_argmax(q, p, x):
    return _ratio(q, p, x) * (q.argmax(-1) == x)


def _neg_kl(q, p, x):
    return -(q * (q.clamp_min(_EPS).log() - p.clamp_min(_EPS).log())).sum(-1)


SCORES: dict[str, Score] = {
    "ratio": Score(_ratio, True, "token likelihood ratio q'_i(x_i) / p_i(x_i) (the default)"),
    "ratio_argmax": Score(_ratio_argmax, True, "the ratio, and 0 unless x_i = argmax q'_i"),
    "slim_prob": Score(lambda q, p, x: _at(q, x), True, "q'_i(x_i)"),
    "neg_entropy": Score(lambda q, p, x: _neg_entropy(q), False, "-H(q'_i): accept where the slim is certain"),
    "neg_kl": Score(_neg_kl, False, "-KL(q'_i || p_i): accept where slim and draft agree as distributions"),
}

CONFIDENCES: dict[str, Confidence] = {
    "max_prob": Confidence(lambda q: q.max(-1).values, "max_v q'_i(v) (the default)"),
    "margin": Confidence(lambda q: (lambda t: t[..., 0] - t[..., 1])(q.topk(2, dim=-1).values), "top-1 minus top-2"),
    "neg_entropy": Confidence(_neg_entropy, "-H(q'_i)"),
}


def direct_accept(score: Score, s: torch.Tensor, tau: float, u: torch.Tensor | None) -> torch.Tensor:
    """Tier 1 decision per position, `[g]` bool. Greedy (`u` None): `s >= tau`; sampling with a
    probabilistic score: accept with probability `min(1, s / tau)`, i.e. `u * tau < s`."""
    if tau == float("inf"):
        return torch.zeros_like(s, dtype=torch.bool)
    if u is None or not score.probabilistic:
        return s >= tau
    return u * tau < s
