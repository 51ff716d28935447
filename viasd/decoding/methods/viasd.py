"""`viasd`: three-tier (N-tier) speculative decoding with routed slim verifiers (docs/method.md).

Notation: draft `p`, slim verifier(s) `q'`, full model `q`, block `x_1..x_g` (0-indexed rows here).
Per block:
0. gate (tier 0): with every tier off, or when the draft is unsure of its own block
   (`min_i p_i(x_i) < gate`), no slim pass runs and the block is a plain `sd` block: the full model
   verifies it losslessly (and checks every lagged token on the way, below). With tiers off this is
   exactly `sd`: the same tokens, the same passes, no slim pass.
1. the slim verifier(s) run once over the block (larger levels only when a position reaches them);
   for `i = 1..g`, for each level `k` (smallest first):
   - direct acceptance: score `s_i >= tau_accept[k]` (sampling, probabilistic score: accept with
     probability `min(1, s_i / tau_accept[k])`) -> keep `x_i`, next position;
   - slim regeneration: confidence `c_i >= tau_slim[k]` -> draw from `norm(max(0, q'_i - p_i))`
     (greedy: `argmax q'_i`); if that is `x_i` it counts as accepted at tier 2 and the block goes on,
     otherwise it replaces `x_i` and the block ends without the full model;
2. escalation, when no level settles position `i`: the full model runs once over every position
   not yet in its cache (tokens of earlier blocks it never saw, plus this block) and the lossless
   test of SD decides positions `i..g`.
If every position settles without `q`, the bonus token `x_{g+1}` comes from the largest slim level
that ran, and only if that level's confidence at `g+1` passes its `tau_slim`; otherwise the block
ends after `x_g`.

Who decides the tiers (`policy.router`, see `_Level` and `decoding/tier_router.py`): the hand-set rules, the
learned router's calibrated probabilities, or the oracle (the target's greedy tokens from a peek pass
counted apart: the ceiling of any router; `oracle_budget` lets it settle a share of wrong tokens).

Lag: the full model's cache lags behind the output. When the lag exceeds `max_lag > 0`, the next block
goes straight to the full model, whose one pass catches up and verifies the block. With `verify_block`,
an escalated block is verified from its first position. With `verify_lagged`, every full-model pass
(escalation, gated or catch-up block) also tests the lagged tokens it is fed — their logits cost only
LM-head rows: greedy, a token must be `argmax q`; sampling, it is accepted with probability `min(1,
q(t)/r(t))` against the distribution `r` it was drawn from (exact for a token drawn from `r`, an
approximation once a tier filtered it). At the first rejection the output rolls back to that position and
the full model's token (greedy: `argmax q`; sampling: a draw from `norm(max(0, q - r))`) replaces it.
Lossy by design: tokens settled by the slim tiers and not re-checked are emitted unverified.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ...errors import PolicyError
from ..acceptance import lossless
from ..kv_cache import model_cache
from ..runner import ModelRunner
from ..sampling import residual
from ..tier_router import LearnedRouter, RouterRows, position_features
from ..tiers import CONFIDENCES, SCORES, direct_accept
from .base import Method, MethodInputs, Session


@dataclass
class ViasdState:
    """What VIA-SD keeps across the blocks of one decode.

    `thresholds`: per slim level, resolved once, `(tau_accept, tau_slim)`. `checked`: leading tokens the full
    model has seen or produced (the output past it is the lag). `proposals`: with sampling and
    `verify_lagged`, position -> the distribution its token was drawn from (`[V]`), for the lagged test.
    Who decides the tiers (`policy.router`): `router`, the learned router on the models' device; `peek`, the
    oracle's runner (the target with a cache of its own, a side runner whose passes are counted apart),
    `router_rows` (the oracle's rows, the router's training data), `reference` (the target's greedy output,
    read instead of a peek while the output follows it) and `wrong` (wrong tokens the budgeted oracle settled)."""

    thresholds: list[tuple[float, float]] = field(default_factory=list)
    checked: int = 0
    proposals: dict[int, torch.Tensor] = field(default_factory=dict)
    router: LearnedRouter | None = None
    peek: ModelRunner | None = None
    router_rows: RouterRows | None = None
    reference: list[int] | None = None
    wrong: int = 0


class _Level:
    """One slim verifier's view of the block: probabilities and host-side tier decisions.

    `logits`, `q`: `[g+1, V]` (rows `q'_1..q'_g` and the bonus row `q'_{g+1}`); `accept`: `[g]` tier-1
    decisions; `confident`: `[g+1]` tier-2 decisions (the last one gates the bonus token). Who decides
    (`policy.router`): `rules`, the score against `tau_accept` and the confidence against `tau_slim`;
    `learned`, the router's P(draft right) >= `tau_accept` and P(slim right) >= `tau_slim`; `oracle`,
    the target's greedy tokens `t` (accept iff `x_i = t_i`, regenerate iff `argmax q'_i = t_i`).
    """

    def __init__(self, s: Session, state: ViasdState, k: int, x: torch.Tensor, p: torch.Tensor, g: int,
                 t: torch.Tensor | None):
        tau_accept, tau_slim = state.thresholds[k]
        self.logits = s.slims[k].forward(s.ids, s.length + g, g + 1)  # rows q'_1..q'_g, q'_{g+1}
        self.q = s.sampler.probs(self.logits)
        router = s.policy.router
        if router == "oracle":
            slim_choice = self.logits.argmax(-1)
            accept, confident = x == t[:g], slim_choice == t
            if state.router_rows is not None and k == 0:
                state.router_rows.add(position_features(p, self.q, x), router_hidden(s, g), x, slim_choice, t)
        elif router == "learned":
            start = time.perf_counter()
            p_draft, p_slim = state.router.probabilities(position_features(p, self.q, x), router_hidden(s, g))
            accept, confident = p_draft >= tau_accept, p_slim >= tau_slim
            self.accept, self.confident = accept.tolist(), confident.tolist()  # host sync inside the timing
            s.stats.router_time_s += time.perf_counter() - start
            return
        else:
            score, confidence = SCORES[s.policy.score], CONFIDENCES[s.policy.confidence]
            u = None if s.sampler.greedy else s.sampler.uniform(g, x.device)
            accept = direct_accept(score, score.fn(self.q[:g], p, x), tau_accept, u)
            confident = confidence.fn(self.q) >= tau_slim
        self.accept = accept.tolist()
        self.confident = confident.tolist()

    def regenerate(self, s: Session, i: int, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The tier-2 token at row `i` and, in sampling mode, the distribution it was drawn from."""
        if s.sampler.greedy:
            return self.logits[i].argmax(), None
        dist = residual(self.q[i], p[i])
        return s.sampler.sample(dist), dist


def set_up(s: Session, inputs: MethodInputs) -> ViasdState:
    """VIA-SD's state: per slim level, resolved once, (tau_accept, tau_slim) and the tier counters; who decides
    the tiers (`policy.router`): the learned router on the models' device, or the oracle's peek runner, the
    target with a cache of its own whose passes are counted apart (`peek_passes`)."""
    policy, levels = s.policy, len(s.slims)
    st = ViasdState(checked=s.prompt_len)
    if levels:
        st.thresholds = list(zip(*policy.levels(levels)))
        s.stats.direct_by_level = [0] * levels
        s.stats.slim_accept_by_level = [0] * levels
        s.stats.regen_by_level = [0] * levels
    if policy.tiers_off:
        return st
    if inputs.router_rows is not None and policy.router != "oracle":
        raise PolicyError("router rows are labelled by the oracle: collect them with router='oracle'")
    if policy.router == "learned":
        router = inputs.router
        if router is None:
            raise PolicyError("router 'learned' needs a fitted router (viasd train-router writes one)")
        if levels != 1:
            raise PolicyError(f"a learned router decides for one slim verifier; this decode has {levels}")
        if router.probe_layers and (s.trunk is None or s.trunk.layers != router.probe_layers):
            have = "no shared trunk" if s.trunk is None else f"a trunk of {s.trunk.layers} layers"
            raise PolicyError(f"the router probes the hidden state after the target's first {router.probe_layers} "
                              f"layers, but this decode has {have} (decode.reuse on, a mask keeping layers "
                              f"0..{router.probe_layers - 1})")
        st.router = router.to(s.device)
    elif policy.router == "oracle":  # its peeks are timed exactly (synchronised) whatever the policy's timing:
        # their seconds are taken off the decode's wall time
        target = s.target_model
        st.peek = ModelRunner("peek", target, lambda: model_cache(target, policy.cache, s.capacity), s.vocab_size, True)
        s.add_side_runner(st.peek)
        st.router_rows = inputs.router_rows
        # not a budgeted oracle's: it reads rows after a wrong token it settled
        if inputs.oracle_reference is not None and not policy.oracle_budget:
            st.reference = list(inputs.oracle_reference)
    return st


def finish(s: Session, st: ViasdState) -> None:
    """The oracle's peeks, counted apart from the method's passes."""
    if st.peek is not None:
        s.stats.peek_passes, s.stats.peek_time_s = st.peek.passes, st.peek.seconds


def router_hidden(s: Session, g: int) -> torch.Tensor | None:
    """`[g + 1, H]`: the shared trunk's residual stream at the inputs whose logits are the block's rows
    (the router's probe), or None without a trunk."""
    if s.trunk is None:
        return None
    return s.trunk.hidden[0, s.length - 1 : s.length + g]


def oracle_targets(s: Session, st: ViasdState, g: int) -> torch.Tensor:
    """`[g + 1]`: the target's greedy tokens at the block's rows given the drafted block (the oracle's
    peek; teacher-forced, counted apart from the decode's passes).

    With a reference (the target's greedy output of this prompt under the same settings: an `ar` decode's
    tokens) and an output that is still its prefix, the rows come from it with no pass: row `i` is the
    target's token given the block's draft tokens `x_0..x_{i-1}`, and the oracle only reads rows up to the
    first draft token that differs from the target's (the block ends there), whose draft prefix is the
    reference's own. Rows past the reference's end, or an output that left it (a full pass that broke a
    near-tie the other way), take the peek pass; a budgeted oracle always does (it reads rows after a wrong
    token it settled)."""
    ref, n = st.reference, len(s.generated)
    if ref is not None and n + g + 1 <= len(ref) and ref[:n] == s.generated:
        s.stats.peek_from_reference += 1
        return torch.tensor(ref[n : n + g + 1], dtype=torch.long, device=s.device)
    return st.peek.forward(s.ids, s.length + g, g + 1).argmax(-1)


def _verify_lagged(s: Session, st: ViasdState, q_logits: torch.Tensor, first: int) -> bool:
    """Test the lagged tokens at positions `st.checked .. s.length-1` against the full model.

    `q_logits` rows are the full model's logits at input positions `first, first+1, ...` (row `r`
    predicts the token at position `first + r + 1`). Returns True when a token was rejected: the
    output then ends at the rejected position with the full model's replacement, and the caller
    ends the block.
    """
    stats = s.stats
    lo, hi = st.checked, s.length  # lagged output positions lo..hi-1
    if lo >= hi:
        return False
    rows = q_logits[lo - 1 - first : hi - 1 - first]  # [hi - lo, V]: q at positions lo..hi-1
    tokens = s.ids[0, lo:hi]
    if s.sampler.greedy:
        choice = rows.argmax(-1)
        ok = tokens == choice
        n = int(ok.to(torch.int64).cumprod(0).sum().item())
        replacement = choice[n] if n < hi - lo else None
    else:
        q = s.sampler.probs(rows)
        r = torch.stack([st.proposals.get(j, q[j - lo]) for j in range(lo, hi)])  # [hi - lo, V]
        u = s.sampler.uniform(hi - lo, rows.device)
        qx, rx = q.gather(-1, tokens[:, None])[:, 0], r.gather(-1, tokens[:, None])[:, 0]
        n = int((u * rx < qx).to(torch.int64).cumprod(0).sum().item())
        replacement = s.sampler.sample(residual(q[n], r[n])) if n < hi - lo else None
    stats.lagged_checked += min(n + 1, hi - lo)
    if replacement is None:
        st.checked = hi
        st.proposals.clear()
        return False
    at = lo + n
    stats.lagged_rejected += 1
    stats.lagged_rolled_back += hi - at
    s.rewind(at)
    s.commit(0, replacement)
    st.checked = s.length
    st.proposals.clear()
    return True


def _full_block(s: Session, st: ViasdState, x: torch.Tensor, p: torch.Tensor | None, g: int, i: int) -> None:
    """The full model settles block positions `i..g-1` (after checking lagged tokens, if asked)."""
    check = s.policy.verify_lagged and st.checked < s.length
    first = s.target.cached if check else s.length - 1 + i  # first input position whose logits we need
    assert first <= s.length - 1 + i and (not check or first <= st.checked - 1), (first, st.checked, s.length)
    q_logits = s.target.forward(s.ids, s.length + g, s.length + g - first)
    if check and _verify_lagged(s, st, q_logits, first):
        s.stats.escalated_blocks += 1
        s.stats.discarded += g
        s.stats.blocks_rolled_back += 1
        return
    rows = q_logits[s.length - 1 + i - first :]  # q_{i+1}..q_{g+1}
    n, token = lossless(x[i:], p[i:] if p is not None else None, rows, s.sampler)
    s.stats.record_full_verification(g, n, already=i)
    s.commit(i + n, token)
    st.checked = s.length
    st.proposals.clear()


def _count_settled(st, settled: list[tuple[bool, int]]) -> None:
    """Add the tier-1 / tier-2 decisions of the positions a block emits without the full model."""
    for direct, k in settled:
        if direct:
            st.accepted_direct += 1
            st.direct_by_level[k] += 1
        else:
            st.accepted_slim += 1
            st.slim_accept_by_level[k] += 1


def _oracle_may_settle_wrong(s: Session, st: ViasdState, i: int) -> bool:
    """The budgeted oracle (`oracle_budget` b): settle a wrong token at block row `i` if the wrong tokens
    settled so far, this one included, stay within b of the tokens emitted by then (spent as it goes)."""
    b = s.policy.oracle_budget
    if s.policy.router != "oracle" or b <= 0 or st.wrong + 1 > b * (len(s.generated) + i + 1):
        return False
    st.wrong += 1
    s.stats.oracle_settled_wrong += 1
    return True


def block(s: Session, state: ViasdState) -> None:
    st, pol = s.stats, s.policy
    # the full model's cache lags more than max_lag behind: this block goes to the full model, whose pass
    # catches up on every lagged token and verifies the block at once (one pass, not a catch-up and then one)
    catch_up = bool(pol.max_lag) and s.length - 1 - s.target.cached > pol.max_lag
    x, p_logits = s.draft_tokens(s.block_size())
    g = len(x)  # a draft with another tokenizer may propose fewer (text_draft.py), even none
    p = s.sampler.probs(p_logits)
    st.blocks += 1
    st.drafted += g
    p_sampling = None if s.sampler.greedy else p
    if catch_up:
        st.catchup_passes += 1
    if catch_up or pol.tiers_off or not g or (pol.gate > 0 and float(p.gather(-1, x[:, None]).min()) < pol.gate):
        st.gated_blocks += 1
        _full_block(s, state, x, p_sampling, g, 0)
        return
    st.grow_positions(g)
    x_host = x.tolist()
    t = oracle_targets(s, state, g) if pol.router == "oracle" else None
    keep_proposals = pol.verify_lagged and not s.sampler.greedy
    levels: list[_Level] = []
    settled: list[tuple[bool, int]] = []  # per settled position: (tier 1?, slim level)
    for i in range(g):
        st.position_reached[i] += 1
        decision = None
        for k in range(len(s.slims)):
            if k == len(levels):
                levels.append(_Level(s, state, k, x, p, g, t))
            level = levels[k]
            if k == 0 and t is not None and not level.confident[i]:
                st.oracle_slim_wrong += 1
            if level.accept[i]:  # tier 1
                decision = (True, k)
                break
            if level.confident[i]:  # tier 2
                token, dist = level.regenerate(s, i, p)
                if int(token) == x_host[i]:
                    decision = (False, k)
                    break
                _count_settled(st, settled)
                st.regenerated_slim += 1
                st.regen_by_level[k] += 1
                st.position_regenerated[i] += 1
                st.verified += i + 1
                st.discarded += g - i - 1
                if keep_proposals:
                    state.proposals.update({s.length + j: p[j] for j in range(i)})
                    state.proposals[s.length + i] = dist
                s.commit(i, token)
                return
        if decision is None and _oracle_may_settle_wrong(s, state, i):
            decision = (True, 0)
        if decision is None:
            # tier 3: the full model decides from position i on; with verify_lagged it re-checks the lagged
            # tokens and this block's rows 0..i-1 too, with verify_block this block's rows 0..i-1 only
            recheck = pol.verify_lagged or pol.verify_block
            if not recheck:
                _count_settled(st, settled)
            _full_block(s, state, x, p_sampling, g, 0 if recheck else i)
            return
        settled.append(decision)
        st.position_settled[i] += 1
    # every position settled without q: the bonus token only if the last level is confident there
    _count_settled(st, settled)
    st.verified += g
    top = levels[-1]
    if keep_proposals:
        state.proposals.update({s.length + j: p[j] for j in range(g)})
    if top.confident[g]:
        st.bonus += 1
        if keep_proposals:
            state.proposals[s.length + g] = top.q[g]
        s.commit(g, s.sampler.pick(top.logits[g], top.q[g]))
    else:
        st.bonus_withheld += 1
        s.commit(g - 1, x[g - 1])


METHOD = Method("viasd", block, set_up=set_up, finish=finish, text_draft=True, shares_trunk=True)
