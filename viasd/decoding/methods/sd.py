"""`sd`: two-tier speculative decoding, draft -> target (docs/method.md (speculative decoding)), lossless."""

from __future__ import annotations

from ..acceptance import lossless


def block(s) -> None:
    g = s.block_size()
    x, p_logits = s.draft_tokens(g)
    p = None if s.sampler.greedy else s.sampler.probs(p_logits)
    q_logits = s.target.forward(s.ids, s.length + g, g + 1)  # rows: q_1..q_g, q_{g+1}
    n, token = lossless(x, p, q_logits, s.sampler)
    s.stats.blocks += 1
    s.stats.drafted += g
    record_full_verification(s.stats, g, n)
    s.commit(n, token)


def record_full_verification(stats, g: int, n: int, already: int = 0) -> None:
    """Count a block whose positions `already..g-1` the full model settled, keeping `n` of them
    (positions before `already` were accepted by cheaper tiers)."""
    stats.escalated_blocks += 1
    stats.accepted_full += n
    if already + n < g:
        stats.rejected_full += 1
        stats.verified += already + n + 1
        stats.discarded += g - already - n - 1
    else:
        stats.bonus += 1
        stats.verified += g
