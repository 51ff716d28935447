"""What to decode with: the method and its parameters (one frozen, validated object)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import PolicyError
from .processors import ProcessorSettings
from .sampling import SamplingConfig

METHODS = ("ar", "sd", "self_sd", "cascade_sd", "spec_cascade", "viasd")
LOSSLESS = frozenset({"ar", "sd", "self_sd", "cascade_sd"})
SPEC_CASCADE_RULES = ("chow", "diff", "opt", "token_v1", "token_v2", "token_v3")
ROUTERS = ("rules", "learned", "oracle")  # how viasd decides its tiers (decoding/tier_router.py)
CACHE_KINDS = ("inplace", "dynamic", "static")  # KV cache of each runner (viasd.kv_cache)
DEFAULT_CACHE = "inplace"
# the fields of a viasd policy that the threshold search sets (a thresholds file holds them)
# the draft model; a feature drafter on the target's trunk (EAGLE-3-style); a shallower routing of the target
DRAFTERS = ("model", "feature", "self")

TUNED_FIELDS = ("gamma", "tau_accept", "tau_slim", "score", "confidence", "gate", "max_lag", "verify_lagged", "router",
                "verify_block", "draft_stop")


def _as_levels(value, n: int, name: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in value) if isinstance(value, (list, tuple)) else (float(value),) * max(n, 1)
    except (TypeError, ValueError):
        raise PolicyError(f"{name} must be a number or a list of numbers (inf switches a tier off), got {value!r}") from None
    if len(values) != max(n, 1):
        raise PolicyError(f"{name} has {len(values)} values but there are {n} slim verifiers (give one per level)")
    if any(math.isnan(v) for v in values):
        raise PolicyError(f"{name} must be a number (inf switches the tier off), got {value}")
    return values


@dataclass(frozen=True)
class DecodePolicy:
    """Decoding method and parameters.

    Common: `gamma` (draft block length), `max_new_tokens`, `sampling`, `seed`, `stop_strings`,
    `eos_token_ids` (None: the target's own). `viasd`: `tau_accept`, `tau_slim` (a float, or one per
    slim verifier for the N-tier form; `inf` switches a tier off), `score`, `confidence`, `max_lag`
    (0 = never force a catch-up: above it the next block goes to the full model, which catches up in the
    same pass), `verify_block` (an escalated block is re-verified from its first position, not from the
    position that escalated), `router`: how the tiers decide (`ROUTERS`): `rules` (the score and
    confidence above against `tau_accept` / `tau_slim`), `learned` (a fitted `router.LearnedRouter`
    passed to `decode`: accept when P(draft right) >= `tau_accept`, regenerate when P(slim right) >=
    `tau_slim`) or `oracle` (greedy only: the target's own greedy token, from a peek pass that is counted
    apart, decides; the ceiling a router can reach), with `oracle_budget` the share of output tokens the
    oracle may settle although they are wrong (spent as it goes; 0 = fidelity 1).
    `draft_stop` (dynamic draft length, every drafting method): a block's drafting stops after a token the
    drafter gave a probability below `draft_stop` (its own distribution, as it drew the token), so `gamma` is
    the most a block drafts (0 = off: always `gamma`). `drafter` (`DRAFTERS`): who drafts for the drafting
    methods, `model` (the draft model), `feature` (a feature drafter on the target's shared trunk,
    `feature_drafter.py`, passed to `decode` as the draft) or `self` (self-speculation under any method: a
    shallower routing of the target, a `SlimVerifier` passed to `decode` as the draft, drafting with a cache of its
    own; under `viasd` and the cascades the slim tier must keep more layers than it); `ModelSet.generate` picks the
    module by it.
    `tree_nodes` (`sd` only; 0 = a chain): draft a tree of at most `tree_nodes` nodes, `gamma` deep, each expanded
    node with `tree_top_k` children, and verify every node in one full pass (`draft_tree.py`: EAGLE-2's dynamic
    tree when greedy, SpecInfer's i.i.d. children along a spine when sampling).
    `spec_cascade`: `rule`, `alpha`. `cascade_sd`: `gamma_slim`, the
    number of slim-level tokens collected before the full model verifies (default `2 * gamma`).
    `cache` (`CACHE_KINDS`, see `kv_cache`): `inplace` (buffers for prompt + max_new_tokens + gamma + 1
    positions written in place, attention over the filled prefix), `dynamic` (transformers'
    DynamicCache, grows by concatenation) or `static` (transformers' StaticCache; attention spans the
    whole buffer; not for sliding-window models). All three give the same tokens. `compile`: run the
    models through `torch.compile(dynamic=True)` (`compilation.py`; compiled once per model and process).
    `generation_config`: apply the per-token settings of the target's generation config (forced BOS/EOS,
    minimum lengths, suppressed and banned tokens, no repeated n-grams, repetition penalty; see
    `processors.py`) to every model's distributions, as `transformers.generate` does; `generation`: settings
    on top of it (a `ProcessorSettings`, or a mapping of its fields).
    """

    method: str = "viasd"
    gamma: int = 4
    max_new_tokens: int = 128
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int = 0
    stop_strings: tuple[str, ...] = ()
    eos_token_ids: tuple[int, ...] | None = None
    tau_accept: float | tuple[float, ...] = 1.0
    tau_slim: float | tuple[float, ...] = 0.5
    score: str = "ratio"
    confidence: str = "max_prob"
    max_lag: int = 0
    gate: float = 0.0
    verify_lagged: bool = True
    verify_block: bool = False
    router: str = "rules"
    oracle_budget: float = 0.0
    reuse: bool = False
    rule: str = "opt"
    alpha: float = 0.1
    gamma_slim: int | None = None
    draft_stop: float = 0.0
    tree_nodes: int = 0
    tree_top_k: int = 4
    drafter: str = "model"
    exact_timing: bool = True
    cache: str = DEFAULT_CACHE
    compile: bool = False
    generation_config: bool = True
    generation: ProcessorSettings = field(default_factory=ProcessorSettings)

    def __post_init__(self):
        from .tiers import CONFIDENCES, SCORES

        if self.method not in METHODS:
            raise PolicyError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if not isinstance(self.gamma, int) or self.gamma < 1:
            raise PolicyError(f"gamma (draft block length) must be a positive integer, got {self.gamma!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise PolicyError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if self.score not in SCORES:
            raise PolicyError(f"unknown score {self.score!r}; choose one of {', '.join(SCORES)}")
        if self.confidence not in CONFIDENCES:
            raise PolicyError(f"unknown confidence {self.confidence!r}; choose one of {', '.join(CONFIDENCES)}")
        if self.rule not in SPEC_CASCADE_RULES:
            raise PolicyError(f"unknown spec_cascade rule {self.rule!r}; choose one of {', '.join(SPEC_CASCADE_RULES)}")
        if not self.alpha >= 0:
            raise PolicyError(f"alpha (lenience) must be >= 0, got {self.alpha}")
        if not isinstance(self.compile, bool):
            raise PolicyError(f"compile must be true or false, got {self.compile!r}")
        if self.cache not in CACHE_KINDS:
            raise PolicyError(f"cache must be one of {', '.join(CACHE_KINDS)}, got {self.cache!r}")
        if self.max_lag < 0:
            raise PolicyError(f"max_lag must be >= 0 (0 = never force a catch-up), got {self.max_lag}")
        if not 0 <= self.gate <= 1:
            raise PolicyError(f"gate must be a probability in [0, 1] (0 = off), got {self.gate}")
        if not isinstance(self.reuse, bool):
            raise PolicyError(f"reuse must be true or false, got {self.reuse!r}")
        if self.router not in ROUTERS:
            raise PolicyError(f"unknown router {self.router!r}; choose one of {', '.join(ROUTERS)}")
        if self.router == "oracle" and not self.sampling.greedy:
            raise PolicyError("the oracle router is defined for greedy decoding (temperature 0) only")
        if not 0 <= self.oracle_budget < 1:
            raise PolicyError(f"oracle_budget must be a share in [0, 1), got {self.oracle_budget}")
        if not isinstance(self.verify_block, bool):
            raise PolicyError(f"verify_block must be true or false, got {self.verify_block!r}")
        if not isinstance(self.verify_lagged, bool):
            raise PolicyError(f"verify_lagged must be true or false, got {self.verify_lagged!r}")
        for name in ("tau_accept", "tau_slim"):  # "inf" (as JSON writes an off tier) reads as a float
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, _as_levels(value, 1, name)[0])
            elif isinstance(value, list):
                object.__setattr__(self, name, tuple(float(v) for v in value))
        if not isinstance(self.generation_config, bool):
            raise PolicyError(f"generation_config must be true or false, got {self.generation_config!r}")
        if isinstance(self.generation, dict):
            object.__setattr__(self, "generation", ProcessorSettings.parse(self.generation))
        if not 0 <= self.draft_stop <= 1:
            raise PolicyError(f"draft_stop must be a probability in [0, 1] (0 = off), got {self.draft_stop}")
        if self.drafter not in DRAFTERS:
            raise PolicyError(f"unknown drafter {self.drafter!r}; choose one of {', '.join(DRAFTERS)}")
        if not isinstance(self.tree_nodes, int) or self.tree_nodes < 0:
            raise PolicyError(f"tree_nodes must be a whole number >= 0 (0 = chain drafting), got {self.tree_nodes!r}")
        if not isinstance(self.tree_top_k, int) or self.tree_top_k < 1:
            raise PolicyError(f"tree_top_k must be a positive integer, got {self.tree_top_k!r}")
        if self.tree_nodes and self.method != "sd":
            raise PolicyError(f"a draft tree (tree_nodes > 0) is verified by the full model in one pass: method 'sd' "
                              f"only, not {self.method!r}")
        if self.tree_nodes and self.draft_stop:
            raise PolicyError("tree_nodes and draft_stop both size the draft: set one of them (the other to 0)")
        if self.tree_nodes and self.cache == "static":
            raise PolicyError("a draft tree compacts the cache after each block: use cache 'inplace' or 'dynamic'")
        if self.gamma_slim is not None and self.gamma_slim < 1:
            raise PolicyError(f"gamma_slim must be a positive integer, got {self.gamma_slim}")
        taus = self.tau_accept if isinstance(self.tau_accept, (list, tuple)) else (self.tau_accept,)
        rules_sampled = self.router == "rules" and not self.sampling.greedy
        if rules_sampled and SCORES[self.score].probabilistic and any(not float(t) > 0 for t in taus):
            # sampling mode accepts with probability min(1, s / tau_accept): tau must be positive
            raise PolicyError(f"tau_accept must be > 0 for the {self.score!r} score in sampling mode, got {self.tau_accept}")

    def as_record(self) -> dict:
        """Every field as JSON-safe values (nested settings as dicts, an infinite threshold as "inf")."""
        from dataclasses import asdict

        def safe(v):
            if isinstance(v, float) and not math.isfinite(v):
                return str(v)
            return [safe(x) for x in v] if isinstance(v, (tuple, list)) else v

        return {k: safe(v) for k, v in asdict(self).items()}

    @classmethod
    def from_record(cls, record: dict) -> DecodePolicy:
        """The policy `as_record` wrote (JSON's lists read back as tuples, the sampling settings as
        `SamplingConfig`); one clear error for a field it does not know."""
        from dataclasses import fields

        known = {f.name for f in fields(cls)}
        unknown = sorted(set(record) - known)
        if unknown:
            raise PolicyError(f"unknown policy field {', '.join(unknown)}")
        values = dict(record)
        if isinstance(values.get("sampling"), dict):
            values["sampling"] = SamplingConfig(**values["sampling"])
        for name in ("stop_strings", "eos_token_ids"):
            if isinstance(values.get(name), list):
                values[name] = tuple(values[name])
        return cls(**values)

    @property
    def lossless(self) -> bool:
        return self.method in LOSSLESS

    @property
    def needs_draft(self) -> bool:
        """A draft model: every method but `ar` and `self_sd` (whose slim drafts)."""
        return self.method not in ("ar", "self_sd")

    @property
    def needs_slim(self) -> bool:
        return self.method in ("viasd", "cascade_sd", "self_sd")

    @property
    def runs_slim(self) -> bool:
        """A slim pass can run: the method needs a slim, and it is not `viasd` with every tier off."""
        return self.needs_slim and not (self.method == "viasd" and self.tiers_off)

    @property
    def tiers_off(self) -> bool:
        """Every tier threshold is `inf`: `viasd` then decodes exactly as `sd` (no slim pass)."""
        values = [*(self.tau_accept if isinstance(self.tau_accept, tuple) else (self.tau_accept,)),
                  *(self.tau_slim if isinstance(self.tau_slim, tuple) else (self.tau_slim,))]
        return all(float(v) == math.inf for v in values)

    def levels(self, n_slims: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-level (tau_accept, tau_slim) for `n_slims` slim verifiers."""
        return (_as_levels(self.tau_accept, n_slims, "tau_accept"), _as_levels(self.tau_slim, n_slims, "tau_slim"))
