"""Turning logits into tokens: greedy or warped sampling (temperature, top-k, top-p), seeded.

Shapes: `logits` and `probs` are float32 `[n, V]` (one row per position) or `[V]`.
In greedy mode tokens are `argmax` of the raw logits, and the probabilities used by scores and
confidences (VIA-SD tiers, cascade deferral rules) are the model's own softmax at temperature 1.
In sampling mode every distribution is the *warped* one (docs/method.md: "all distributions are after
temperature, top-k and top-p warping"), the same warp applied to draft, slim and target.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import PolicyError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    def __post_init__(self):
        if not self.temperature >= 0:
            raise PolicyError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise PolicyError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise PolicyError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """Warps logits and draws tokens and uniforms from one seeded generator on the models' device."""

    def __init__(self, config: SamplingConfig, device: torch.device, seed: int):
        self.config = config
        self.greedy = config.greedy
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """`[..., V]` logits -> `[..., V]` probabilities (warped in sampling mode, T=1 in greedy mode)."""
        if self.greedy:
            return torch.softmax(logits, dim=-1)
        cfg = self.config
        logits = logits / cfg.temperature
        if cfg.top_k and cfg.top_k < logits.shape[-1]:
            kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if cfg.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
            sorted_probs = torch.softmax(sorted_logits, dim=-1)
            # drop a token when the mass strictly before it already reaches top_p (the first always stays)
            drop_sorted = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) >= cfg.top_p
            drop = drop_sorted.scatter(-1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        return torch.softmax(logits, dim=-1)

    def pick(self, logits: torch.Tensor, probs: torch.Tensor | None = None) -> torch.Tensor:
        """One token per row: `[n, V] -> [n]` (or `[V] -> []`); argmax when greedy."""
        if self.greedy:
            return logits.argmax(dim=-1)
        if probs is None:
            probs = self.probs(logits)
        return self.sample(probs)

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        """Draw from `[n, V]` -> `[n]` or `[V]` -> `[]` probabilities."""
        if probs.dim() == 1:
            return torch.multinomial(probs, 1, generator=self.generator)[0]
        return torch.multinomial(probs, 1, generator=self.generator)[:, 0]

    def uniform(self, n: int, device: torch.device) -> torch.Tensor:
        return torch.rand(n, generator=self.generator, device=device)


def residual(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """`norm(max(0, q - p))` over the last dim: the distribution to resample from after a rejection.

    Leviathan et al. 2023, Alg. 1: sampling from it after rejecting `x ~ p` with probability
    `1 - min(1, q(x)/p(x))` makes the emitted token exactly `q`-distributed. If `q == p` the residual
    is empty (a rejection then has probability 0); `q` itself is returned so the draw stays defined.
    """
    diff = (q - p).clamp_min(0)
    total = diff.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, diff / total.clamp_min(torch.finfo(diff.dtype).tiny), q)


def unsure(sampler: Sampler, logits: torch.Tensor, token: torch.Tensor, threshold: float) -> bool:
    """Dynamic draft length: the drafter gave its own `token` (drawn from `logits` `[V]`) a probability below
    `threshold`, so drafting stops after it (`DecodePolicy.draft_stop`; 0 never stops). The decision reads the
    drafter's distribution only, never the verifier's, so the speculative test stays exact."""
    return threshold > 0 and float(sampler.probs(logits)[token]) < threshold
