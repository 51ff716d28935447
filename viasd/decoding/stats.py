"""Exact decoding statistics (docs/method.md (statistics)): counts, not estimates.

Accounting identities every decode satisfies (tested):
- draft tokens:  drafted = accepted_direct + accepted_slim + accepted_full + regenerated_slim
                           + rejected_slim + rejected_full + discarded            (sd, viasd, spec_cascade)
  for `cascade_sd` the draft hop and the slim->full hop are counted separately:
                  drafted = slim_accepted + rejected_slim + discarded
                  slim_accepted + slim_generated = accepted_full + rejected_full + discarded_slim_level
- output:        new_tokens = accepted_direct + accepted_slim + accepted_full + regenerated_slim
                              + rejected_full + bonus + lagged_rejected - lagged_rolled_back - truncated
  (each full-model rejection emits exactly one replacement token, a rejected lagged token too;
  `lagged_rolled_back` are emitted tokens taken back when the full model rejected a lagged token
  before them (viasd `verify_lagged`); `truncated` are tokens cut by EOS, a stop string or
  `max_new_tokens` after a block produced them).
- viasd tier pass rates by block position `i`: `position_reached[i]` positions the slim tiers examined,
  `position_settled[i]` settled there by tier 1 or tier 2 (draft token kept), `position_regenerated[i]`
  replaced by the slim (the block ends); the rest escalated (`position_escalation_rate`).
  Per block, with `e` that per-position escalation rate and `c` the chance a position continues the
  block (settled), a block escalates with probability `sum_i e c^i = e (1 - c^g) / (1 - c)`: a
  regeneration ends its block without escalating, so this is not `1 - prod_i r_i`.
- the oracle router (`router: oracle`): `peek_passes` / `peek_time_s` are its teacher-forced look-ups of
  the target's greedy tokens, not part of the method (its `wall_time_s` leaves them out);
  `peek_from_reference` the blocks that read those tokens from the target's greedy output given with the
  decode (`oracle_reference`) instead, with no peek pass;
  `oracle_slim_wrong` the examined positions where the slim's greedy choice was not the target's (the
  slim's error rate on the decode's own positions), `oracle_settled_wrong` the wrong tokens a budgeted
  oracle settled.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


@dataclass
class DecodeStats:
    method: str
    prompt_tokens: int = 0
    new_tokens: int = 0
    blocks: int = 0  # draft/verify cycles
    drafted: int = 0
    # a draft with another tokenizer: the tokens it generated in its own vocabulary (`drafted` counts its
    # proposals, those tokens re-tokenised into the target's vocabulary through text)
    draft_own_tokens: int = 0
    verified: int = 0  # per block: positions up to and including the first non-accepted one
    accepted_direct: int = 0  # tier 1 (sum over slim levels)
    accepted_slim: int = 0  # tier 2: the slim verifier's choice was the draft token itself
    accepted_full: int = 0  # accepted by the full model's lossless test
    regenerated_slim: int = 0  # tier 2: draft token replaced by the slim verifier, full model skipped
    rejected_slim: int = 0  # cascade_sd: draft tokens rejected by the slim hop's lossless test
    rejected_full: int = 0  # positions rejected by the full model (an expensive recompute)
    discarded: int = 0  # draft tokens after the first non-accepted position of their block
    bonus: int = 0  # tokens sampled after a fully accepted block
    truncated: int = 0
    escalated_blocks: int = 0  # blocks in which the full model ran to verify
    catchup_passes: int = 0  # viasd max_lag: blocks sent to the full model because its cache lagged too far (one pass each)
    gated_blocks: int = 0  # viasd: blocks sent straight to the full model (tiers off, or the draft gate)
    bonus_withheld: int = 0  # viasd: blocks settled by the tiers whose bonus token failed the confidence test
    lagged_checked: int = 0  # viasd verify_lagged: lagged tokens the full model tested
    lagged_rejected: int = 0  # ... and rejected (each emits the full model's replacement)
    lagged_rolled_back: int = 0  # emitted tokens taken back by those rejections
    blocks_rolled_back: int = 0  # blocks whose draft was dropped because a lagged token was rejected
    # cascade_sd only: the slim level's own tokens
    slim_accepted: int = 0
    slim_generated: int = 0
    discarded_slim_level: int = 0
    cascade_draft_kept: int = 0  # draft tokens that passed both hops
    # N-tier VIA-SD: per slim level (smallest first)
    direct_by_level: list[int] = field(default_factory=list)
    slim_accept_by_level: list[int] = field(default_factory=list)
    regen_by_level: list[int] = field(default_factory=list)
    # viasd: per block position (0..gamma-1), see the module docstring
    position_reached: list[int] = field(default_factory=list)
    position_settled: list[int] = field(default_factory=list)
    position_regenerated: list[int] = field(default_factory=list)
    # work per model: name -> value (`passes`: decoding passes, the prompt's prefill apart; `time_s`: all of its seconds)
    passes: dict[str, int] = field(default_factory=dict)
    tokens_processed: dict[str, int] = field(default_factory=dict)
    time_s: dict[str, float] = field(default_factory=dict)
    # decoder layers x tokens each runner computed; with reuse (viasd) the shared layers 0..k-1 are the
    # `trunk`'s, computed once per position, and `slim` / `target` count only their layers after it
    layer_tokens: dict[str, int] = field(default_factory=dict)
    # passes by runner layout and width, `"<name>:<layers>/<width>"` (tokens fed; rows, for an exit head) or
    # `".../prefill"` (the prompt's pass, `DecodeSession.prefill`): counts and seconds, what the cost model is fitted on;
    # `"loop:<method>/1"`: the decode loop's calls of the method's block and their seconds outside every pass
    pass_widths: dict[str, int] = field(default_factory=dict)
    pass_width_s: dict[str, float] = field(default_factory=dict)
    # viasd routers (decoding/tier_router.py): the learned router's seconds; the oracle's peeks and counts
    router_time_s: float = 0.0
    peek_passes: int = 0
    peek_time_s: float = 0.0
    peek_from_reference: int = 0  # oracle blocks whose greedy tokens came from the given reference, no peek pass
    oracle_slim_wrong: int = 0
    oracle_settled_wrong: int = 0
    wall_time_s: float = 0.0
    encoder_time_s: float = 0.0  # encoder-decoder models: encoding the prompt, once per distinct encoder

    def grow_positions(self, g: int) -> None:
        """Make the per-position counters at least `g` long."""
        for name in ("position_reached", "position_settled", "position_regenerated"):
            values = getattr(self, name)
            values.extend([0] * (g - len(values)))

    def record_full_verification(self, g: int, n: int, already: int = 0) -> None:
        """Count a block whose positions `already..g-1` the full model settled, keeping `n` of them
        (positions before `already` were accepted by cheaper tiers)."""
        self.escalated_blocks += 1
        self.accepted_full += n
        if already + n < g:
            self.rejected_full += 1
            self.verified += already + n + 1
            self.discarded += g - already - n - 1
        else:
            self.bonus += 1
            self.verified += g

    def record_tree_verification(self, m: int, n: int, leaf: bool) -> None:
        """Count a drafted tree of `m` nodes the full model verified in one pass, accepting a path of `n` nodes
        (`draft_tree.py`). At a leaf the emitted token is a bonus; else the full model rejected every child of
        the last accepted node (one replacement). The other nodes are discarded: not on the path, or past it."""
        self.escalated_blocks += 1
        self.accepted_full += n
        self.verified += n + (0 if leaf else 1)
        if leaf:
            self.bonus += 1
            self.discarded += m - n
        else:
            self.rejected_full += 1
            self.discarded += m - n - 1

    def layouts(self) -> dict[str, str]:
        """Runner name -> its layout `name:layers` (decoder layers per token it ran), for runners that ran:
        the unit per-pass costs belong to (a full pass and a pass after a shared trunk differ)."""
        return {m: f"{m}:{round(self.layer_tokens[m] / self.tokens_processed[m])}" for m in self.passes
                if self.passes[m] and self.tokens_processed.get(m) and m in self.layer_tokens}

    def position_pass_rates(self) -> list[float | None]:
        """Per block position: the share of positions the slim tiers examined that they settled
        (draft token kept, no full model)."""
        return [_ratio(s, r) for s, r in zip(self.position_settled, self.position_reached)]

    @property
    def position_escalation_rate(self) -> float | None:
        """Share of the positions the slim tiers examined that went to the full model (neither settled
        nor regenerated): the rate to set beside the slim's error rate."""
        reached = sum(self.position_reached)
        return _ratio(reached - sum(self.position_settled) - sum(self.position_regenerated), reached)

    @property
    def slim_error_rate(self) -> float | None:
        """Oracle decodes only: share of examined positions where the slim's greedy choice was wrong."""
        oracle = self.peek_passes or self.peek_from_reference
        return _ratio(self.oracle_slim_wrong, sum(self.position_reached)) if oracle else None

    @property
    def gated_rate(self) -> float | None:
        """Share of blocks that skipped the slim tiers (gate or tiers off)."""
        return _ratio(self.gated_blocks, self.blocks)

    @property
    def draft_kept(self) -> int:
        """Draft tokens that ended up in the output."""
        if self.method == "cascade_sd":
            return self.cascade_draft_kept
        return self.accepted_direct + self.accepted_slim + self.accepted_full

    @property
    def rejection_rate(self) -> float | None:
        """Positions rejected by the full model / verified positions (the paper's sense)."""
        return _ratio(self.rejected_full, self.verified)

    @property
    def acceptance_rate(self) -> float | None:
        """Draft tokens kept / draft tokens drafted (the vLLM sense)."""
        return _ratio(self.draft_kept, self.drafted)

    @property
    def slim_regen_rate(self) -> float | None:
        return _ratio(self.regenerated_slim, self.verified)

    @property
    def mean_accepted_length(self) -> float | None:
        """Draft tokens kept per block (tau, without the replacement/bonus token)."""
        return _ratio(self.draft_kept, self.blocks)

    @property
    def tokens_per_block(self) -> float | None:
        return _ratio(self.new_tokens + self.truncated, self.blocks)

    @property
    def block_escalation_rate(self) -> float | None:
        """Share of blocks that needed the full model."""
        return _ratio(self.escalated_blocks, self.blocks)

    @property
    def tokens_per_second(self) -> float | None:
        return _ratio(self.new_tokens, self.wall_time_s)

    @property
    def prefill_time_s(self) -> float:
        """Seconds of the prompt's prefill passes (`DecodeSession.prefill`), every model's."""
        return sum(s for key, s in self.pass_width_s.items() if key.endswith("/prefill"))

    @property
    def decode_time_s(self) -> float:
        """The wall time without the prompt's prefill and encoding: the time spent generating, which the
        speed ratios compare per generated token (prompts of one length cost every method the same prefill,
        and outputs of different lengths would spread it differently)."""
        return max(0.0, self.wall_time_s - self.prefill_time_s - self.encoder_time_s)

    @property
    def decode_seconds_per_token(self) -> float | None:
        return _ratio(self.decode_time_s, self.new_tokens)

    def full_passes_per_token(self) -> float | None:
        return _ratio(self.passes.get("target", 0), self.new_tokens)

    @classmethod
    def merge(cls, parts: list[DecodeStats]) -> DecodeStats:
        """Counters summed over several decodes (rates then follow from the sums)."""
        if not parts:
            raise ValueError("nothing to merge")
        total = cls(method=parts[0].method)
        for part in parts:
            for name, value in vars(part).items():
                current = getattr(total, name)
                if isinstance(value, bool) or name == "method":
                    continue
                if isinstance(value, (int, float)):
                    setattr(total, name, current + value)
                elif isinstance(value, list):
                    n = max(len(current), len(value))
                    setattr(total, name, [(current[i] if i < len(current) else 0) + (value[i] if i < len(value) else 0)
                                          for i in range(n)])
                elif isinstance(value, dict):
                    for key, v in value.items():
                        current[key] = current.get(key, 0) + v
        return total

    def as_dict(self) -> dict:
        """Counters plus the derived rates, JSON-ready."""
        out = asdict(self)
        for name in (
            "draft_kept",
            "rejection_rate",
            "acceptance_rate",
            "slim_regen_rate",
            "mean_accepted_length",
            "tokens_per_block",
            "block_escalation_rate",
            "gated_rate",
            "position_escalation_rate",
            "slim_error_rate",
            "tokens_per_second",
            "prefill_time_s",
            "decode_time_s",
            "decode_seconds_per_token",
        ):
            out[name] = getattr(self, name)
        out["full_passes_per_token"] = self.full_passes_per_token()
        out["position_pass_rates"] = self.position_pass_rates()
        return out

    def summary(self) -> str:
        """A few human-readable lines."""

        def pct(x):
            return "n/a" if x is None else f"{100 * x:.1f}%"

        lines = [
            f"method {self.method}: {self.new_tokens} new tokens in {self.wall_time_s:.3f}s "
            f"({(self.tokens_per_second or 0):.1f} tok/s)",
        ]
        if self.drafted:
            lines.append(
                f"drafted {self.drafted} in {self.blocks} blocks; acceptance {pct(self.acceptance_rate)}, "
                f"rejection {pct(self.rejection_rate)}, mean accepted length {self.mean_accepted_length:.2f}"
            )
            if self.method == "viasd":
                lines.append(
                    f"tiers: direct {self.accepted_direct}, slim-accepted {self.accepted_slim}, "
                    f"slim-regenerated {self.regenerated_slim}, full-accepted {self.accepted_full}, "
                    f"full-rejected {self.rejected_full}; escalated blocks {pct(self.block_escalation_rate)} "
                    f"(gated {pct(self.gated_rate)}); bonus withheld {self.bonus_withheld}; lagged checked "
                    f"{self.lagged_checked}, rejected {self.lagged_rejected} (rolled back {self.lagged_rolled_back})"
                )
        lines.append(
            "passes: "
            + ", ".join(
                f"{name} {self.passes[name]} ({self.tokens_processed[name]} tok, {self.time_s[name]:.3f}s)"
                for name in self.passes
            )
        )
        return "\n".join(lines)
