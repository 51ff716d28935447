"""Acceptance tests on a drafted block. Notation of docs/method.md: draft `p`, verifier `q`,
block `x_1..x_g`; tensors are 0-indexed here, so row `i` of `p`/`q` is the paper's `p_{i+1}`/`q_{i+1}`.

Every function returns `(n, next_token)`: the number of leading block tokens kept and the token
emitted after them (a replacement after a rejection, or the bonus token after a fully accepted
block, drawn from the last verifier row). `n` is the only host sync of a block.
"""

from __future__ import annotations

import torch

from .sampling import Sampler, residual


def leading_true(mask: torch.Tensor) -> int:
    """Number of leading True values of a `[g]` bool tensor (one host sync)."""
    return int(mask.to(torch.int64).cumprod(0).sum().item())


def lossless(x: torch.Tensor, p: torch.Tensor | None, q_logits: torch.Tensor, sampler: Sampler) -> tuple[int, torch.Tensor]:
    """Speculative sampling (Leviathan et al. 2023 Alg. 1; Chen et al. 2023).

    x: `[g]` draft tokens; p: `[g, V]` draft probabilities (unused when greedy); q_logits: `[g+1, V]`
    verifier logits, row `g` for the bonus token.
    Accept `x_i` with probability `min(1, q_i(x_i) / p_i(x_i))`; at the first rejection draw from
    `norm(max(0, q_i - p_i))`; if all `g` pass, draw the bonus from `q_{g+1}`. The output is exactly
    `q`-distributed. Greedy (temperature -> 0): accept iff `x_i = argmax q_i`, replace by `argmax q_i`.
    """
    g = x.shape[0]
    if sampler.greedy:
        choice = q_logits.argmax(-1)  # [g+1]
        n = leading_true(x == choice[:g])
        return n, choice[n]
    q = sampler.probs(q_logits)
    return proposal_test(x, p, q[:g], q[g], sampler)


def proposal_test(x: torch.Tensor, p: torch.Tensor, target: torch.Tensor, bonus: torch.Tensor,
                  sampler: Sampler) -> tuple[int, torch.Tensor]:
    """The sampling-mode test against any per-position target distribution `target` `[g, V]`.

    With `target = q` it is lossless SD; with a cascade's `pi` (spec_cascade) it samples from `pi`.
    `bonus`: `[V]` distribution for the token after a fully accepted block.
    """
    g = x.shape[0]
    px = p.gather(-1, x[:, None])[:, 0]
    tx = target.gather(-1, x[:, None])[:, 0]
    u = sampler.uniform(g, x.device)
    n = leading_true(u * px < tx)  # u < min(1, t(x)/p(x)) without dividing
    if n < g:
        return n, sampler.sample(residual(target[n], p[n]))
    return n, sampler.sample(bonus)
