"""DIMR cost functions (docs/method.md (DIMR)), on log-probabilities `[..., V]` at teacher-forced positions.

- `path` (default): E[ KL(p || q'_z) + KL(q'_z || q) ] -- the slim verifier should sit between draft
  and target so that both hops are short (KL(p||q) >= KL(p||u) + KL(u||q) for a projection u);
- `target`: E[ KL(q || q'_z) ] -- closest to the target alone (ablation).
"""

from __future__ import annotations

import torch

COSTS = ("path", "target")


def kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(P || Q) per position: `[..., V]` log-probabilities -> `[...]`."""
    return (logp.exp() * (logp - logq)).sum(-1)


def position_costs(kind: str, draft_logp: torch.Tensor, slim_logp: torch.Tensor,
                   target_logp: torch.Tensor) -> torch.Tensor:
    """Cost at every position, `[...]`; average it for the expectation."""
    if kind == "path":
        return kl(draft_logp, slim_logp) + kl(slim_logp, target_logp)
    if kind == "target":
        return kl(target_logp, slim_logp)
    raise ValueError(f"unknown DIMR cost {kind!r}; choose one of {', '.join(COSTS)}")
