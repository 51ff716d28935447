"""`sd`: two-tier speculative decoding, draft -> target (docs/method.md (speculative decoding)), lossless."""

from __future__ import annotations

from ..acceptance import lossless
from .base import Method, Session


def block(s: Session, state: None) -> None:
    verify(s, *s.draft_tokens(s.block_size()))


def verify(s: Session, x, p_logits) -> None:
    """The full model settles a drafted block `x` `[g]` (drafter logits `[g, V]`) by the lossless test and commits.
    `g` may be under `gamma`: a draft with another tokenizer or a dynamic draft length proposes fewer, even none."""
    g = len(x)
    p = None if s.sampler.greedy else s.sampler.probs(p_logits)
    q_logits = s.target.forward(s.ids, s.length + g, g + 1)  # rows: q_1..q_g, q_{g+1}
    n, token = lossless(x, p, q_logits, s.sampler)
    s.stats.blocks += 1
    s.stats.drafted += g
    s.stats.record_full_verification(g, n)
    s.commit(n, token)


METHOD = Method("sd", block, text_draft=True)
