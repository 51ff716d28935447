"""When a decode ends: `max_new_tokens`, an EOS token, or a stop string in the decoded text."""

from __future__ import annotations

from collections.abc import Iterable


class StopRule:
    """Finds where generated tokens must be cut.

    `cut(tokens)` looks at the generated tokens (new tokens only, host list) and returns the length to
    keep: the first EOS is kept, as `transformers` does; a stop string is kept with the token that
    completes it; nothing past `max_new_tokens` is kept. Only the unchecked tail is decoded, so a
    check costs O(block + longest stop string), not O(sequence).
    """

    def __init__(self, max_new_tokens: int, eos_token_ids: Iterable[int] = (), stop_strings: Iterable[str] = (),
                 tokenizer=None):
        self.max_new_tokens = max_new_tokens
        self.eos = frozenset(eos_token_ids)
        self.stop_strings = tuple(s for s in stop_strings if s)
        if self.stop_strings and tokenizer is None:
            raise ValueError("stop strings need a tokenizer to decode the generated text")
        self.tokenizer = tokenizer
        # a stop string spans at most this many tokens (a token decodes to >= 1 character, or to part of one)
        self._lookback = max((len(s.encode()) for s in self.stop_strings), default=0) + 1
        self._checked = 0

    def cut(self, tokens: list[int]) -> int | None:
        """Length of `tokens` to keep if decoding must stop now, else None."""
        start = self._checked
        end = min(len(tokens), self.max_new_tokens)
        for i in range(start, end):
            if tokens[i] in self.eos:
                return i + 1
        if self.stop_strings:
            hit = self._stop_string_end(tokens, start, end)
            if hit is not None:
                return hit
        self._checked = end
        return end if end >= self.max_new_tokens else None

    def rewind(self, n: int) -> None:
        """The generated tokens were cut back to `n`: check from there again."""
        self._checked = min(self._checked, n)

    def _stop_string_end(self, tokens: list[int], start: int, end: int) -> int | None:
        lo = max(0, start - self._lookback)
        if not any(s in self._text(tokens[lo:end]) for s in self.stop_strings):
            return None
        for j in range(max(start, lo + 1), end + 1):  # the shortest prefix that contains a stop string
            if any(s in self._text(tokens[lo:j]) for s in self.stop_strings):
                return j
        return None

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
