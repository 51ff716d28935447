"""`ar`: the target alone, one token per forward pass (the reference every lossless method equals)."""

from __future__ import annotations

from .base import Method, Session


def block(s: Session, state: None) -> None:
    logits = s.target.forward(s.ids, s.length, 1)[0]
    s.commit(0, s.sampler.pick(logits))


METHOD = Method("ar", block)
