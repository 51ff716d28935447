"""Tier decisions as classification (docs/method.md, "The router"): what a block position looks like to
the engine, the learned router that turns it into calibrated probabilities, and the oracle's labels.

VIA-SD's tiers settle a draft token without the full model `q` when they believe it is the token `q`
would have chosen. With the target's greedy token `t_i` at block row `i`, two events decide the best
action there: the draft is right (`x_i = t_i`: accept, tier 1) or the slim verifier is right
(`argmax q'_i = t_i`: regenerate, tier 2); when neither is, only the full model helps (escalate).

- `position_features` computes, for every row of a block, what the engine already has: the draft's and
  the slim's probabilities and their summaries. Rows `0..g-1` are the block's draft positions, row `g`
  the bonus position (no draft token there: its draft features are 0 and its `bonus` feature is 1).
- `LearnedRouter` holds two logistic models over those features (and, optionally, a linear probe of the
  shared trunk's hidden state at the position: the "saturation" signal of CALM and LayerSkip) and
  returns `P(draft right)` and `P(slim right)` per row: a standardisation, two matrix-vector products
  and a sigmoid on the block's `g + 1` rows, no per-token Python call.
- `RouterRows` collects features and oracle labels from decodes (the oracle router knows `t_i`), the
  training data of the router (`viasd.training.tier_router` fits it).

Shapes: `p`, `q`: `[g, V]` / `[g + 1, V]` probabilities (draft rows `p_1..p_g`, slim rows
`q'_1..q'_{g+1}`), `x`: `[g]` draft tokens, `hidden`: `[g + 1, H]` or None; features `[g + 1, F]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

_EPS = 1e-12

# one column per name, in this order (a saved router records them; a mismatch is refused on load)
FEATURES = (
    "log_p_x",  # log p_i(x_i)
    "log_q_x",  # log q'_i(x_i)
    "log_ratio",  # log q'_i(x_i) - log p_i(x_i): the default tier-1 score, in logs
    "log_q_max",  # log max_v q'_i(v): the default tier-2 confidence, in logs
    "log_p_max",  # log max_v p_i(v)
    "q_margin",  # top-1 minus top-2 of q'_i
    "q_entropy",  # H(q'_i), nats
    "p_entropy",  # H(p_i), nats
    "agree",  # 1 if x_i = argmax q'_i
    "position",  # block row i (0-based)
    "bonus",  # 1 on the bonus row g (no draft token)
    "log_q_second",  # log of q'_i's second-largest probability: with log_q_max, the log-odds of its top two
)


def position_features(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The router's scalar features of a block, `[g + 1, len(FEATURES)]` float32.

    `p`: `[g, V]` draft probabilities at the block's positions, `q`: `[g + 1, V]` slim probabilities
    (the last row is the bonus position), `x`: `[g]` draft tokens.
    """
    g = x.shape[0]
    top2 = q.topk(2, dim=-1)
    q_max, q_arg = top2.values[:, 0], top2.indices[:, 0]
    log_q, log_p = q.clamp_min(_EPS).log(), p.clamp_min(_EPS).log()  # each computed once, entropies included
    out = torch.zeros((g + 1, len(FEATURES)), dtype=torch.float32, device=q.device)
    log_p_x = log_p.gather(-1, x[:, None])[:, 0]
    log_q_x = log_q[:g].gather(-1, x[:, None])[:, 0]
    out[:g, 0] = log_p_x
    out[:g, 1] = log_q_x
    out[:g, 2] = log_q_x - log_p_x
    out[:, 3] = q_max.clamp_min(_EPS).log()
    out[:g, 4] = p.max(-1).values.clamp_min(_EPS).log()
    out[:, 5] = q_max - top2.values[:, 1]
    out[:, 6] = -(q * log_q).sum(-1)
    out[:g, 7] = -(p * log_p).sum(-1)
    out[:g, 8] = (q_arg[:g] == x).float()
    out[:, 9] = torch.arange(g + 1, dtype=torch.float32, device=q.device)
    out[g, 10] = 1.0
    out[:, 11] = top2.values[:, 1].clamp_min(_EPS).log()
    return out


@dataclass
class LogisticHead:
    """`P(event) = sigmoid(((z - mean) / scale) @ weight + bias)` over inputs `z` `[n, D]`."""

    mean: torch.Tensor  # [D]
    scale: torch.Tensor  # [D]
    weight: torch.Tensor  # [D]
    bias: float

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(((z - self.mean) / self.scale) @ self.weight + self.bias)

    def to(self, device, dtype=torch.float32) -> LogisticHead:
        return LogisticHead(*(t.to(device, dtype) for t in (self.mean, self.scale, self.weight)), self.bias)


@dataclass
class LearnedRouter:
    """Calibrated `P(x_i = t_i)` (draft right) and `P(argmax q'_i = t_i)` (slim right) per block row.

    `draft` and `slim`: logistic heads over `[features, probe]` (`probe`: the shared trunk's hidden
    state at the row, when `probe_layers > 0`: the router was fitted with the residual stream after the
    target's layers `0..probe_layers-1`, and a decode must give that same stream). `info`: what the
    fit recorded (held-out AUC, ECE, rows), carried along for reports.
    """

    draft: LogisticHead
    slim: LogisticHead
    probe_layers: int = 0
    features: tuple[str, ...] = FEATURES
    info: dict = field(default_factory=dict)

    def to(self, device) -> LearnedRouter:
        return LearnedRouter(self.draft.to(device), self.slim.to(device), self.probe_layers, self.features, self.info)

    def inputs(self, features: torch.Tensor, hidden: torch.Tensor | None) -> torch.Tensor:
        """`[g + 1, F (+ H)]`: the features, and the probe's hidden states when the router has a probe."""
        if self.probe_layers:
            return torch.cat([features, hidden.float()], dim=-1)
        return features

    def probabilities(self, features: torch.Tensor, hidden: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`(P(draft right) [g], P(slim right) [g + 1])` for a block's `[g + 1, F]` features."""
        z = self.inputs(features, hidden)
        return self.draft(z[:-1]), self.slim(z)


@dataclass
class RouterRows:
    """Training rows for the router, collected from oracle decodes (`decode(..., router_rows=RouterRows())`).

    Per block, the rows whose prefix is the target's own (every earlier draft token of the block was
    right): rows `0..m` with `m` the first row the draft got wrong, plus the bonus row when there is
    none. Those are exactly the rows a router decides on: a later row is never reached, since the block
    ends at the first wrong draft token. `draft_right` is NaN on a bonus row (it has no draft token).
    """

    features: list[torch.Tensor] = field(default_factory=list)  # [n, F] per block
    hidden: list[torch.Tensor] = field(default_factory=list)  # [n, H] per block (empty without a trunk)
    draft_right: list[torch.Tensor] = field(default_factory=list)  # [n] in {0, 1, nan}
    slim_right: list[torch.Tensor] = field(default_factory=list)  # [n] in {0, 1}
    group: list[int] = field(default_factory=list)  # per block: which decode it came from (held-out splits)
    current_group: int = 0

    def add(self, features: torch.Tensor, hidden: torch.Tensor | None, x: torch.Tensor, slim_argmax: torch.Tensor,
            target: torch.Tensor) -> None:
        """One block: `features` `[g + 1, F]`, `x` `[g]`, `slim_argmax` and `target` `[g + 1]` (greedy tokens)."""
        g = x.shape[0]
        wrong = (x != target[:g]).nonzero()
        n = int(wrong[0, 0]) + 1 if wrong.numel() else g + 1
        draft = torch.full((n,), float("nan"))
        draft[: min(n, g)] = (x[: min(n, g)] == target[: min(n, g)]).float().cpu()
        self.features.append(features[:n].cpu())
        if hidden is not None:
            self.hidden.append(hidden[:n].float().cpu())
        self.draft_right.append(draft)
        self.slim_right.append((slim_argmax[:n] == target[:n]).float().cpu())
        self.group.append(self.current_group)

    def __len__(self) -> int:
        return sum(len(t) for t in self.slim_right)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every row: `features` `[N, F]`, `hidden` `[N, H]` (or `[N, 0]`), `draft_right`, `slim_right`,
        `group` `[N]` (the decode each row came from)."""
        n = [len(t) for t in self.slim_right]
        return {
            "features": torch.cat(self.features) if self.features else torch.zeros((0, len(FEATURES))),
            "hidden": torch.cat(self.hidden) if self.hidden else torch.zeros((sum(n), 0)),
            "draft_right": torch.cat(self.draft_right) if self.draft_right else torch.zeros(0),
            "slim_right": torch.cat(self.slim_right) if self.slim_right else torch.zeros(0),
            "group": torch.tensor([gr for gr, k in zip(self.group, n) for _ in range(k)], dtype=torch.long),
        }


def oracle_settings(gamma: int | None = None, budget: float = 0.0) -> dict:
    """The policy fields of the oracle beside a tuned policy (`gamma`: the tuned one): every tier decided by
    the oracle, none switched off (the taus are unused), no gate, catch-up or lagged check. `budget`: the
    budgeted oracle's share of wrong tokens it may settle (`oracle_budget`; 1 - a fidelity floor puts it at
    that floor, the ceiling a router spending the same fidelity can reach); 0: fidelity 1."""
    return {"router": "oracle", "tau_accept": 1.0, "tau_slim": 0.5, "gate": 0.0, "max_lag": 0, "verify_lagged": False,
            "oracle_budget": budget, **({"gamma": gamma} if gamma else {})}


def floor_budget(min_fidelity: float | None) -> float | None:
    """The budgeted oracle's budget at a fidelity floor, `1 - min_fidelity` (None without a floor, or at a floor
    of 1, where the budgeted oracle is the oracle)."""
    if min_fidelity is None or min_fidelity >= 1:
        return None
    return 1.0 - min_fidelity


def headroom_share(viasd_vs_sd: float | None, oracle_vs_sd: float | None) -> float | None:
    """The share of the oracle's headroom over SD that VIA-SD takes: `(viasd/sd - 1) / (oracle/sd - 1)`
    (None when either is missing or the oracle does not beat SD)."""
    if viasd_vs_sd is None or oracle_vs_sd is None or oracle_vs_sd <= 1:
        return None
    return (viasd_vs_sd - 1) / (oracle_vs_sd - 1)
