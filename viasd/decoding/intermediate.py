"""An independently trained intermediate model in the slim verifier's place: the seed's
"independent intermediate model" ablation (docs/method.md (methods and ablations)). It offers the same two things the
engine uses from a `SlimVerifier` — `model` (a causal LM) and `new_cache()` — but its weights are
its own, so its memory overhead is a whole model, not just a KV cache."""

from __future__ import annotations

from torch import nn

from .kv_cache import model_cache


class IndependentVerifier:
    def __init__(self, model: nn.Module, name: str = "independent"):
        self.model = model
        self.name = name

    def new_cache(self, kind: str = "dynamic", capacity: int | None = None):
        return model_cache(self.model, kind, capacity)

    def __call__(self, input_ids, cache=None, **kwargs):
        return self.model(input_ids=input_ids, cache=cache, **kwargs)
