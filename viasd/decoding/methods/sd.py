"""`sd`: two-tier speculative decoding, draft -> target (docs/method.md (speculative decoding)), lossless."""

from __future__ import annotations

from ..acceptance import lossless
from .base import Method, Session


def block(s: Session, state: None) -> None:
    x, p_logits = s.draft_tokens(s.block_size())
    g = len(x)  # a draft with another tokenizer may propose fewer (text_draft.py), even none
    p = None if s.sampler.greedy else s.sampler.probs(p_logits)
    q_logits = s.target.forward(s.ids, s.length + g, g + 1)  # rows: q_1..q_g, q_{g+1}
    n, token = lossless(x, p, q_logits, s.sampler)
    s.stats.blocks += 1
    s.stats.drafted += g
    s.stats.record_full_verification(g, n)
    s.commit(n, token)


METHOD = Method("sd", block, text_draft=True)
