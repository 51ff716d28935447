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

from . import sd
from .base import Method, Session


def block(s: Session, state: None) -> None:
    sd.verify(s, *s.draft_tokens(s.block_size(), drafter=s.slims[0]))


METHOD = Method("self_sd", block, shares_trunk=True)
