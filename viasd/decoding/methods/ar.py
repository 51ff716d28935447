"""`ar`: the target alone, one token per forward pass (the reference every lossless method equals)."""

from __future__ import annotations


def block(s) -> None:
    logits = s.target.forward(s.ids, s.length, 1)[0]
    s.commit(0, s.sampler.pick(logits))
