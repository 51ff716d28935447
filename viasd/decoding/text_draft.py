"""A draft with another tokenizer than the target's: its proposals are carried into the target's tokens
through text, as `transformers`' universal assisted generation carries them.

Per block (`TextDraft.propose`):
1. the committed sequence (target tokens) is decoded to text and encoded with the draft's tokenizer;
   the draft's cache keeps the longest prefix that encoding shares with what it has seen, and is fed
   the rest (a re-tokenised boundary costs a few positions, not the prompt);
2. the draft generates `gamma` tokens of its own, greedily;
3. their text is encoded with the target's tokenizer after the last committed tokens' text (so a word
   continued across the boundary is tokenised as the target would), giving up to `gamma` target
   tokens: the block's proposals.

The draft's distribution over the *target's* vocabulary is unknown, so each proposal is a point mass
`p_i = δ(x_i)` (the session passes one-hot draft rows). Speculative sampling then accepts `x_i` with
probability `min(1, q_i(x_i) / 1) = q_i(x_i)` and on rejection samples `norm(max(0, q_i − δ(x_i)))`,
which is `q_i` without `x_i`: the emitted token is exactly `q_i`-distributed whatever proposed `x_i`
(greedy: accepted iff `x_i = argmax q_i`). The output is the target's, greedy or sampled; only the
acceptance rate depends on how well the draft's text matches. A block whose draft text yields no target
token (e.g. the draft ended its text) proposes nothing and the target emits one token.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import PromptError
from .runner import ModelRunner

TAIL = 8  # committed tokens re-read on each side to tokenise a word continued across the block boundary


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _text_after(tokenizer, tail: list[int], new: list[int]) -> str:
    """The text `new` adds after `tail` (decoded together, so a leading space or a merged byte survives)."""
    before = tokenizer.decode(tail, skip_special_tokens=True)
    both = tokenizer.decode(tail + new, skip_special_tokens=True)
    return both[len(before):] if both.startswith(before) else tokenizer.decode(new, skip_special_tokens=True)


def _tokens_after(tokenizer, tail: list[int], text: str) -> list[int]:
    """`text` in `tokenizer`'s tokens as they follow `tail` (the tail's own tokens kept as they are): the
    longest suffix of the tail that re-encodes to itself with the text after it gives the context (a
    tail that starts inside a word may not); without one, the text alone."""
    for k in range(len(tail)):
        context = tail[k:]
        ids = tokenizer(tokenizer.decode(context, skip_special_tokens=True) + text, add_special_tokens=False)["input_ids"]
        if ids[: len(context)] == context:
            return ids[len(context):]
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class TextDraft:
    """The draft model with its own token sequence, cache and tokenizer (`runner`: its passes, named
    "draft", counted like any model's)."""

    def __init__(self, model: nn.Module, draft_tokenizer, target_tokenizer, new_cache, vocab_size: int,
                 exact_timing: bool = True):
        self.runner = ModelRunner("draft", model, new_cache, vocab_size, exact_timing)
        self.tokenizer = draft_tokenizer
        self.target_tokenizer = target_tokenizer
        self.eos = {t for t in [getattr(draft_tokenizer, "eos_token_id", None)] if t is not None}
        self.seq: list[int] = []  # the draft's tokens, of which the first `runner.cached` are in its cache
        self.own_tokens = 0  # tokens the draft generated in its own vocabulary

    def start(self) -> None:
        self.runner.start()
        self.seq = []

    def _sync(self, target_ids: list[int]) -> None:
        """Make `seq` the draft's encoding of the committed text, keeping the cached prefix it shares."""
        text = self.target_tokenizer.decode(target_ids, skip_special_tokens=True)
        seq = self.tokenizer(text, add_special_tokens=True)["input_ids"] or sorted(self.eos)[:1]
        if not seq:
            raise PromptError("the prompt has no text the draft's tokenizer can encode")
        keep = min(_common_prefix(self.seq, seq), len(seq) - 1)  # the last token is fed with the block
        self.runner.rollback(min(self.runner.cached, keep))
        self.seq = seq

    def prefill(self, target_ids: list[int]) -> None:
        """Feed the draft its encoding of the prompt's text but its last token, recorded as its prefill (as
        every model's: `DecodeSession.prefill`)."""
        self._sync(target_ids)
        if len(self.seq) > 1:
            ids = torch.tensor([self.seq], dtype=torch.long, device=self.runner.device)
            self.runner.prefill(ids, len(self.seq) - 1)

    @torch.inference_mode()
    def propose(self, target_ids: list[int], g: int) -> list[int]:
        """Up to `g` target tokens continuing `target_ids` (prompt + committed tokens), from `g` greedy
        draft tokens carried through text."""
        self._sync(target_ids)
        start = len(self.seq)
        buffer = torch.tensor([self.seq + [0] * g], dtype=torch.long, device=self.runner.device)
        for k in range(g):
            token = int(self.runner.forward(buffer, start + k, 1)[0].argmax())
            buffer[0, start + k] = token
            self.seq.append(token)
            self.own_tokens += 1
            if token in self.eos:
                break
        new = self.seq[start:]
        text = _text_after(self.tokenizer, self.seq[max(0, start - TAIL) : start], new)
        if not text:
            return []
        return _tokens_after(self.target_tokenizer, target_ids[-TAIL:], text)[:g]
