"""`cascade_sd`: draft -> slim -> target, each hop a lossless speculative test (the "binary
hierarchical" prior work). Lossless: the output has exactly the target's distribution.

Inner hop: the draft proposes `g` tokens, the slim verifier `q'` tests them (the lossless test of
speculative decoding, [Leviathan et al. 2023](https://arxiv.org/abs/2211.17192), with `q'` as the
verifier), yielding tokens `y` that are exactly `q'`-distributed. Rounds repeat until `gamma_slim`
slim-level tokens are collected. Outer hop: the full model runs once over all `y` and tests them
with `q'` as the proposal: accept `y_j` with probability `min(1, q_j(y_j) / q'_j(y_j))`, resample
from `norm(max(0, q_j - q'_j))`, bonus from `q` after a fully accepted run.
"""

from __future__ import annotations

import torch

from ..acceptance import lossless, proposal_test
from .base import Method, Session


def block(s: Session, state: None) -> None:
    st, pol = s.stats, s.policy
    slim = s.slims[0]
    start = s.length
    want = min(pol.gamma_slim or 2 * pol.gamma, s.remaining)
    m = 0  # slim-level tokens y_0..y_{m-1}, at positions start..start+m-1
    rows: list[torch.Tensor] = []  # q'_j logits at each y_j, for the outer test
    from_draft: list[bool] = []
    while m < want:
        g = max(1, min(pol.gamma, want - m))
        x, p_logits = s.draft_tokens(g, start=start + m)
        g = len(x)  # fewer with a dynamic draft length (draft_stop)
        p = None if s.sampler.greedy else s.sampler.probs(p_logits)
        qs_logits = slim.forward(s.ids, start + m + g, g + 1)
        n, token = lossless(x, p, qs_logits, s.sampler)
        s.ids[0, start + m + n] = token
        st.drafted += g
        st.slim_accepted += n
        st.slim_generated += 1
        if n < g:
            st.rejected_slim += 1
            st.discarded += g - n - 1
        rows.append(qs_logits[: n + 1])
        from_draft += [True] * n + [False]
        m += n + 1
        for r in (s.draft, slim):  # positions past the new token are stale
            r.rollback(min(r.cached, start + m - 1))
    y = s.ids[0, start : start + m].clone()
    q_logits = s.target.forward(s.ids, start + m, m + 1)
    qs_logits = torch.cat(rows)
    if s.sampler.greedy:
        n, token = lossless(y, None, q_logits, s.sampler)
    else:
        q = s.sampler.probs(q_logits)
        n, token = proposal_test(y, s.sampler.probs(qs_logits), q[:m], q[m], s.sampler)
    st.blocks += 1
    st.escalated_blocks += 1
    st.accepted_full += n
    st.cascade_draft_kept += sum(from_draft[:n])
    if n < m:
        st.rejected_full += 1
        st.verified += n + 1
        st.discarded_slim_level += m - n - 1
    else:
        st.bonus += 1
        st.verified += m
    s.commit(n, token)


METHOD = Method("cascade_sd", block)
