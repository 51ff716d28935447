"""`self_sd`: self-speculative decoding, the slim drafts and the full model verifies (LayerSkip's
self-speculation, [Elhoushi et al. 2024](https://arxiv.org/abs/2404.16710); Draft & Verify,
[Zhang et al. 2024](https://arxiv.org/abs/2309.08168)), lossless.

The draft `p` is the slim verifier itself (the target routed through a layer mask; on a LayerSkip-style
target, the early exit): it proposes `g` tokens one at a time, and the full model `q` runs once over the
block and decides by the lossless speculative test ([Leviathan et al. 2023](https://arxiv.org/abs/2211.17192)):
accept `x_i` with probability `min(1, q_i(x_i) / p_i(x_i))` (greedy: iff `x_i = argmax q_i`), at the first
rejection draw from `norm(max(0, q_i - p_i))`, after a fully accepted block a bonus token from `q_{g+1}`. With
reuse and a mask that keeps layers `0..k-1`, the draft's passes compute the shared trunk's KV cache once and
the verification runs only layers `k..L-1` over the block (`reuse.py`): the full model never redoes the
draft's work. No separate draft model is loaded.
"""

from __future__ import annotations

import torch

from ..acceptance import lossless
from ..sampling import unsure
from .base import Method, Session


def draft_with_slim(s: Session, g: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to `g` tokens drafted by the smallest slim at positions `length..`: tokens `[k]` (written into `ids`)
    and the slim's logits `[k, V]`, `k < g` when `policy.draft_stop` ends the block early
    (`sampling.unsure`); its first pass catches up every token it has not seen."""
    slim, start, rows = s.slims[0], s.length, []
    for k in range(g):
        logits = slim.forward(s.ids, start + k, 1)[0]
        token = s.ids[0, start + k] = s.sampler.pick(logits)
        rows.append(logits)
        if unsure(s.sampler, logits, token, s.policy.draft_stop):
            break
    return s.ids[0, start : start + len(rows)].clone(), torch.stack(rows)


def block(s: Session, state: None) -> None:
    x, p_logits = draft_with_slim(s, s.block_size())
    g = len(x)
    p = None if s.sampler.greedy else s.sampler.probs(p_logits)
    q_logits = s.target.forward(s.ids, s.length + g, g + 1)  # rows: q_1..q_g, q_{g+1}
    n, token = lossless(x, p, q_logits, s.sampler)
    s.stats.blocks += 1
    s.stats.drafted += g
    s.stats.record_full_verification(g, n)
    s.commit(n, token)


METHOD = Method("self_sd", block, shares_trunk=True)
