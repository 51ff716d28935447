"""An independently trained intermediate model in the slim verifier's place: the seed's
"independent intermediate model" ablation (DESIGN.md §2.5). It offers the same two things the
engine uses from a `SlimVerifier` — `model` (a causal LM) and `new_cache()` — but its weights are
its own, so its memory overhead is a whole model, not just a KV cache."""

from __future__ import annotations

from torch import nn


class IndependentVerifier:
    def __init__(self, model: nn.Module, name: str = "independent"):
        self.model = model
        self.name = name

    def new_cache(self, max_len: int | None = None):
        from .engine import model_cache

        return model_cache(self.model, max_len)

    def __call__(self, input_ids, cache=None, **kwargs):
        return self.model(input_ids=input_ids, cache=cache, **kwargs)
