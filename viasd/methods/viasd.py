"""`viasd`: three-tier (N-tier) speculative decoding with routed slim verifiers (DESIGN.md §2.2).

Per block: the draft proposes `x_1..x_g` with `p`; slim verifier(s) `q'` run once over the block (the
first always, larger ones only when a position reaches them); then for `i = 1..g` in order, for each
slim level `k` (smallest first):
1. direct acceptance: score `s_i >= tau_accept[k]` (sampling, probabilistic score: with probability
   `min(1, s_i / tau_accept[k])`) -> keep `x_i`, next position;
2. slim regeneration: confidence `c_i >= tau_slim[k]` -> draw from `norm(max(0, q'_i - p_i))`
   (greedy: `argmax q'_i`); if that is `x_i` it counts as accepted at tier 2 and the block goes on,
   otherwise it replaces `x_i` and the block ends without running the full model;
3. when no level settles position `i`: escalate. The full model runs once over every position not
   yet in its cache (accepted tokens of earlier blocks it never saw, plus this block) and the
   lossless test of §2.1 decides positions `i..g`.
If every position is settled by the slim tiers the bonus token comes from the largest slim level
that ran. The full model's cache therefore lags behind the output; with `max_lag > 0` a lag above
it forces one parallel catch-up pass at the start of a block.
Lossy by design: tiers 1-2 emit tokens the full model never checked.
"""

from __future__ import annotations

import torch

from ..acceptance import lossless
from ..sampling import residual
from ..tiers import CONFIDENCES, SCORES, direct_accept
from .sd import record_full_verification


class _Level:
    """One slim verifier's view of the block: probabilities and host-side tier decisions."""

    def __init__(self, s, k: int, x: torch.Tensor, p: torch.Tensor, g: int):
        tau_accept, tau_slim = s.tier_thresholds[k]
        score, confidence = SCORES[s.policy.score], CONFIDENCES[s.policy.confidence]
        self.logits = s.slims[k].forward(s.ids, s.length + g, g + 1)  # rows q'_1..q'_g, q'_{g+1}
        self.q = s.sampler.probs(self.logits)
        u = None if s.sampler.greedy else s.sampler.uniform(g, x.device)
        accept = direct_accept(score, score.fn(self.q[:g], p, x), tau_accept, u)
        confident = confidence.fn(self.q[:g]) >= tau_slim
        self.accept, self.confident = torch.stack((accept, confident)).tolist()  # one host sync

    def regenerate(self, s, i: int, p: torch.Tensor) -> torch.Tensor:
        if s.sampler.greedy:
            return self.logits[i].argmax()
        return s.sampler.sample(residual(self.q[i], p[i]))


def block(s) -> None:
    st, pol = s.stats, s.policy
    if pol.max_lag and s.length - 1 - s.target.cached > pol.max_lag:
        s.target.forward(s.ids, s.length - 1, 1)  # catch up in one parallel pass
        st.catchup_passes += 1
    g = s.block_size()
    x, p_logits = s.draft_tokens(g)
    p = s.sampler.probs(p_logits)
    x_host = x.tolist()
    st.blocks += 1
    st.drafted += g
    levels: list[_Level] = []
    i = 0
    while i < g:
        settled = False
        for k in range(len(s.slims)):
            if k == len(levels):
                levels.append(_Level(s, k, x, p, g))
            level = levels[k]
            if level.accept[i]:  # tier 1
                st.accepted_direct += 1
                st.direct_by_level[k] += 1
                settled = True
                break
            if level.confident[i]:  # tier 2
                token = level.regenerate(s, i, p)
                if int(token) == x_host[i]:
                    st.accepted_slim += 1
                    st.slim_accept_by_level[k] += 1
                    settled = True
                    break
                st.regenerated_slim += 1
                st.regen_by_level[k] += 1
                st.verified += i + 1
                st.discarded += g - i - 1
                s.commit(i, token)
                return
        if not settled:  # tier 3: the full model decides positions i..g
            q_logits = s.target.forward(s.ids, s.length + g, g + 1 - i)  # rows q_{i+1}..q_{g+1}
            n, token = lossless(x[i:], None if s.sampler.greedy else p[i:], q_logits, s.sampler)
            record_full_verification(st, g, n, already=i)
            s.commit(i + n, token)
            return
        i += 1
    st.bonus += 1
    st.verified += g
    s.commit(g, s.sampler.pick(levels[-1].logits[g], levels[-1].q[g]))
