"""`spec_cascade`: speculative cascades ("Faster Cascades via Speculative Decoding",
[Narasimhan et al. 2024](https://arxiv.org/abs/2405.19261)), lossy. In our notation the draft is `p` and
the target `q` (the paper names them the other way round).

The target distribution at each position is a cascade `pi` of `p` and `q`, sampled by the lossless
speculative test ([Leviathan et al. 2023](https://arxiv.org/abs/2211.17192)) with `pi` in place of `q`:
accept `x ~ p` with probability `min(1, pi(x)/p(x))`, else draw from `norm(max(0, pi - p))`.

Sequence-level deferral rules, `delta = 1` means "defer to the target" (`pi = q`), else `pi = p`:
- `chow`:  delta = 1[max_v p(v) < 1 - alpha]
- `diff`:  delta = 1[max_v p(v) < max_v q(v) - alpha]
- `opt`:   delta = 1[max_v p(v) < max_v q(v) - alpha * TV(p, q)]     (the plug-in optimal rule)
Token-specific rules keep the draft token when it lies in an acceptable set `A` of the target's:
`pi(v) = p(v) 1[v in A] + q(v) * sum_{v' not in A} p(v')`, with
- `token_v1`: A = {v : q(v) >= max q - alpha}
- `token_v2`: A = {v : q(v) >= (1 - alpha) max q}
- `token_v3`: A = {v : q(v) >= max q - alpha * TV(p, q)}
(our reading of the paper's three token-level variants; each is a proper distribution). Rules are
evaluated on the models' temperature-1 distributions in greedy mode; the greedy decision keeps `x`
when `pi` does not defer at `x` and otherwise uses the target's argmax.
"""

from __future__ import annotations

import torch

from ..acceptance import leading_true, proposal_test
from .base import Method, Session


def _tv(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return 0.5 * (p - q).abs().sum(-1)


def defer(rule: str, alpha: float, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Sequence-level rules: `[g]` bool, True where the target takes over. p, q: `[g, V]`."""
    p_max, q_max = p.max(-1).values, q.max(-1).values
    if rule == "chow":
        return p_max < 1 - alpha
    if rule == "diff":
        return p_max < q_max - alpha
    if rule == "opt":
        return p_max < q_max - alpha * _tv(p, q)
    raise ValueError(rule)


def acceptable(rule: str, alpha: float, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Token rules: `[g, V]` bool, the target's acceptable set `A` at each position."""
    q_max = q.max(-1, keepdim=True).values
    if rule == "token_v1":
        return q >= q_max - alpha
    if rule == "token_v2":
        return q >= (1 - alpha) * q_max
    if rule == "token_v3":
        return q >= q_max - alpha * _tv(p, q)[:, None]
    raise ValueError(rule)


def cascade_target(rule: str, alpha: float, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """`pi`: `[g, V]` per-position cascade distribution of draft `p` and target `q`."""
    if rule.startswith("token_"):
        a = acceptable(rule, alpha, p, q).to(p.dtype)
        return p * a + q * (p * (1 - a)).sum(-1, keepdim=True)
    d = defer(rule, alpha, p, q)[:, None]
    return torch.where(d, q, p)


def block(s: Session, state: None) -> None:
    pol = s.policy
    x, p_logits = s.draft_tokens(s.block_size())
    g = len(x)  # fewer with a dynamic draft length (draft_stop)
    q_logits = s.target.forward(s.ids, s.length + g, g + 1)
    p = s.sampler.probs(p_logits)
    q = s.sampler.probs(q_logits)
    if s.sampler.greedy:
        if pol.rule.startswith("token_"):
            keep = acceptable(pol.rule, pol.alpha, p, q[:g]).gather(-1, x[:, None])[:, 0]
        else:
            keep = ~defer(pol.rule, pol.alpha, p, q[:g])
        choice = q_logits.argmax(-1)
        n = leading_true(keep | (x == choice[:g]))
        token = choice[n]
    else:
        pi = cascade_target(pol.rule, pol.alpha, p, q[:g])
        n, token = proposal_test(x, p, pi, q[g], s.sampler)
    s.stats.blocks += 1
    s.stats.drafted += g
    s.stats.record_full_verification(g, n)
    s.commit(n, token)


METHOD = Method("spec_cascade", block)
