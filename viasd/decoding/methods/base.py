"""What a decoding method is: a `Method` (its block function, the state it makes at set-up, what it needs of
the session), and the `Session` surface a method may use.

A decode runs `method.block(session, state)` until a stop rule fires (`engine.DecodeSession.run`). The
session owns what every method shares: the token buffer, the model runners with their caches, the sampler,
the statistics, committing and rolling back. Whatever one method alone keeps across blocks (VIA-SD's
per-level thresholds, its router, the full model's lag) lives in that method's own state, a dataclass
its `set_up` makes once per decode; the statistics a method adds are declared fields of `DecodeStats`. So
a new method, a new drafter or a batch dimension adds a module here, not attributes to the session.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from ..runner import ModelRunner
from ..sampling import Sampler
from ..stats import DecodeStats


@dataclass(frozen=True)
class MethodInputs:
    """What a caller may hand a method beyond the models and the policy (`decode`'s keyword arguments).

    `router`: the fitted learned router (`tier_router.LearnedRouter`) of `policy.router == "learned"`;
    `router_rows`: with the oracle router, a `tier_router.RouterRows` that every block's features and labels
    are appended to; `oracle_reference`: the target's greedy output of this prompt (an `ar` decode's tokens),
    which spares the oracle its peek passes while the output follows it."""

    router: Any = None
    router_rows: Any = None
    oracle_reference: Sequence[int] | None = None


class Session(Protocol):
    """The session surface a method uses (`engine.DecodeSession` implements it).

    Buffer: `ids` LongTensor `[1, capacity]`, `length` committed tokens (prompt + new), `prompt_len`,
    `generated` (new tokens), `remaining` (tokens `max_new_tokens` still allows), `done`.
    Invariant at every block start: the last committed token has been fed to no runner
    (`runner.cached <= length - 1`), so one forward over `ids[cached : length + g]` returns the logits of
    every block position and of the bonus position.
    Models: `draft`, `target`, `slims` (smallest first), `trunk` (the layers the slim and the full model
    share, with reuse; else None), each a runner (`runner.ModelRunner`: `forward(ids, upto, rows)` returns
    the last `rows` logits `[rows, V]` after feeding `ids[cached:upto]`; `rollback(n)`; `cached`).
    `target_model`: the target's `nn.Module` (for a side runner of the method's own, such as the oracle's peek).
    Sampling: `sampler` (greedy or the policy's temperature/top-k/top-p, seeded), `vocab_size`, `device`.
    `policy` (`DecodePolicy`), `stats` (`DecodeStats`), `capacity` (positions of the buffer).
    `text_draft`: the draft of another tokenizer (`text_draft.TextDraft`) or None; `batch`: the `batching.Batch` this
    decode is a row of, or None (one prompt)."""

    policy: Any
    ids: torch.Tensor
    length: int
    prompt_len: int
    generated: list[int]
    done: bool
    draft: ModelRunner | None
    target: ModelRunner
    slims: list[ModelRunner]
    trunk: Any
    target_model: nn.Module
    sampler: Sampler
    stats: DecodeStats
    vocab_size: int
    device: torch.device
    capacity: int
    text_draft: Any
    batch: Any

    @property
    def remaining(self) -> int: ...

    def block_size(self, limit: int | None = None) -> int:
        """Draft tokens for the next block: `gamma`, fewer near `max_new_tokens`, never 0."""

    def draft_tokens(self, g: int, start: int | None = None,
                     drafter: ModelRunner | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft up to `g` tokens at `start..` (default: the end) with `drafter` (default: the draft): tokens `[k]`
        (written into `ids`), logits `[k, V]`; `k < g` with a draft of another tokenizer or `policy.draft_stop`."""

    def commit(self, n_keep: int, token: torch.Tensor | int) -> None:
        """Keep the first `n_keep` block tokens, append `token`, roll every cache back, apply the stop rules."""

    def rewind(self, length: int) -> None:
        """Drop the committed tokens at positions `length..` (a `commit` follows)."""

    def add_side_runner(self, runner: ModelRunner) -> None:
        """A runner the method uses whose passes are not the method's work (the oracle's peeks): its caches
        follow the decode's, its seconds are taken off the decode's wall time."""


def no_state(session: Session, inputs: MethodInputs) -> None:
    """The set-up of a method that keeps nothing across blocks."""
    return None


def nothing_to_finish(session: Session, state) -> None:
    """The finish of a method that adds nothing to the statistics at the end."""


@dataclass(frozen=True)
class Method:
    """A decoding method.

    `block(session, state)`: one draft/verify cycle that ends with one `session.commit` (or none, once
    `session.done`). `set_up(session, inputs)`: the method's own state, made once per decode after the runners
    exist and before the prompt is prefilled. `finish(session, state)`: statistics the method adds at the end.
    `text_draft`: the method can take a draft with another tokenizer (its proposals are point masses);
    `shares_trunk`: the slim's leading layers may be computed once for the full model (`reuse.py`)."""

    name: str
    block: Callable[[Session, Any], None]
    set_up: Callable[[Session, MethodInputs], Any] = no_state
    finish: Callable[[Session, Any], None] = nothing_to_finish
    text_draft: bool = False
    shares_trunk: bool = False
