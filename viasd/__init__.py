"""viasd: VIA-SD three-tier speculative decoding with a slim verifier routed out of the target.

Notebook use::

    from viasd import load_models, DecodePolicy, SamplingConfig
    models = load_models("models/target", draft="models/draft", masks=[[0, 2, 4, 6]])
    out = models.generate("def fib(n):", DecodePolicy(method="viasd", gamma=4, max_new_tokens=64))
    print(out.text, out.stats.rejection_rate)
"""

from .decoding.engine import DecodeResult, decode
from .decoding.policy import METHODS, DecodePolicy
from .decoding.sampling import SamplingConfig
from .decoding.slim import RoutingMask, SlimVerifier
from .decoding.stats import DecodeStats
from .errors import ViasdError
from .models import ModelSet, load_model, load_models, load_tokenizer

__all__ = [
    "DecodePolicy",
    "DecodeResult",
    "DecodeStats",
    "METHODS",
    "ModelSet",
    "RoutingMask",
    "SamplingConfig",
    "SlimVerifier",
    "ViasdError",
    "decode",
    "load_model",
    "load_models",
    "load_tokenizer",
]
