"""A KV cache shared by the rows of a batch, each row at its own length: per-row offsets in place.

Speculative decoding accepts a different number of tokens per row and block, so after one block the rows
of a batch sit at different lengths, and a row that rolls back must not move the others. Two ways are
common: left padding with position ids and a 2-D attention mask (transformers' batched `generate`), which
keeps every row's end aligned and so must shift or re-pad whole caches each time the rows' lengths drift
apart; or per-row offsets into one buffer, as paged caches do (vLLM, SGLang). Here the rows keep their own
offsets in one in-place buffer `[B, H, capacity, D]` per layer, so a row's rollback is one integer and
nothing is ever moved:

- a pass feeds every row `W` columns, right-aligned: row `r` feeds its `w_r <= W` new tokens in the last
  `w_r` columns, padding before them (`w_r = 0`: a row with nothing to feed to this model now);
- column `c` of row `r` writes its K/V at slot `write[r, c]`: its own position `o_r + c - (W - w_r)` for a fed
  token (`o_r` the row's cached length), and a slot past the row's end for a pad (`o_r + w_r + c`), which
  no real query of that row ever reads and a later write overwrites;
- the attention mask `[B, 1, W, S]` lets column `c` of row `r` see the slots `<= write[r, c]`, and the
  position ids are the same slots, so a fed token sees exactly its row's prefix and itself.

Right alignment puts every row's last fed tokens in the last columns, so a model's `logits_to_keep` (the
rows a method asks for) stays one number per pass. The mask is handed to the model as a prepared 4-D mask,
which transformers uses as it is.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicLayer

from ..errors import PolicyError
from .kv_cache import DroppedLayer, InPlaceLayer, cache_parts


@dataclass(frozen=True)
class Feed:
    """The layout of one batched pass. `write`: LongTensor `[B, W]`, the slot each column writes (and its
    position id); `span`: slots the pass reads, `max_r(o_r) + W`; `mask`: `[B, 1, W, span]` additive float
    mask (0 where a column may attend, the dtype's minimum elsewhere). `rows`: None when the pass covers every
    row of the cache; else LongTensor `[B]`, the cache rows it covers (a sub-batch: their K/V are gathered)."""

    write: torch.Tensor
    span: int
    mask: torch.Tensor
    rows: torch.Tensor | None = None

    @classmethod
    def build(cls, offsets: list[int], widths: list[int], dtype: torch.dtype, device,
              rows: list[int] | None = None) -> Feed:
        """The feed of rows at cached lengths `offsets` feeding `widths` new tokens each (W = max width)."""
        o = torch.tensor(offsets, dtype=torch.long, device=device)[:, None]  # [B, 1]
        w = torch.tensor(widths, dtype=torch.long, device=device)[:, None]
        width = max(widths)
        c = torch.arange(width, device=device)[None, :]  # [1, W]
        pad = width - w  # leading pad columns of each row
        write = torch.where(c >= pad, o + c - pad, o + w + c)  # [B, W]
        span = max(offsets) + width
        slots = torch.arange(span, device=device)[None, None, :]  # [1, 1, S]
        allowed = slots <= write[:, :, None]  # [B, W, S]
        mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        return cls(write, span, mask[:, None], None if rows is None else torch.tensor(rows, dtype=torch.long,
                                                                                     device=device))


class RaggedLayer(DynamicLayer):
    """One full-attention layer's K/V for every row of a batch, `[B, H, capacity, D]`, written at the slots of
    the current `Feed` (`feed`, set by the batch before each pass). `keys`/`values` are views of the first
    `span` slots; the capacity doubles when a feed writes past it."""

    def __init__(self, rows: int, capacity: int):
        super().__init__()
        self.rows = rows
        self.capacity = max(1, int(capacity))
        self.feed: Feed | None = None
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        shape = (self.rows, key_states.shape[1], self.capacity, key_states.shape[-1])
        self._k = key_states.new_zeros(shape)
        self._v = value_states.new_zeros((*shape[:3], value_states.shape[-1]))
        self.is_initialized = True

    def _grow(self, needed: int) -> None:
        self.capacity = max(needed, 2 * self.capacity)
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = old.new_zeros((*old.shape[:2], self.capacity, old.shape[-1]))
            new[..., : old.shape[2], :] = old
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Scatter `key_states`/`value_states` `[B, H, W, D]` to the feed's slots; return views `[B, H, span, D]`."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        feed = self.feed
        if feed.span > self.capacity:
            self._grow(feed.span)
        if feed.rows is not None:  # a sub-batch: write its rows in place, attend over a gathered copy of them
            heads = torch.arange(self._k.shape[1], device=self._k.device)
            index = (feed.rows[:, None, None], heads[None, :, None], feed.write[:, None, :])  # [R, H, W] each
            self._k[index] = key_states
            self._v[index] = value_states
            self.keys = self._k[feed.rows, :, : feed.span]
            self.values = self._v[feed.rows, :, : feed.span]
            return self.keys, self.values
        index = feed.write[:, None, :, None]
        self._k.scatter_(2, index.expand(-1, self._k.shape[1], -1, self._k.shape[-1]), key_states)
        self._v.scatter_(2, index.expand(-1, self._v.shape[1], -1, self._v.shape[-1]), value_states)
        self.keys = self._k[..., : feed.span, :]
        self.values = self._v[..., : feed.span, :]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return 0 if self.feed is None else self.feed.span - self.feed.write.shape[1]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return (self.feed.span if self.feed is not None else query_length), 0

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows `rows` (LongTensor `[B']`), in that order: rows that left the batch."""
        self.rows = len(rows)
        if self.is_initialized:
            self._k, self._v = self._k[rows], self._v[rows]


def ragged_cache(template, rows: int, capacity: int):
    """A cache with `template`'s layer layout (a runner's batch-1 cache: kept and dropped slots) whose kept
    full-attention slots are `RaggedLayer`s of `rows` rows. Sliding-window, static and encoder-decoder
    caches have no ragged form here: one clear error."""
    if hasattr(template, "self_attention_cache"):
        raise PolicyError("batched decoding is implemented for decoder-only models; decode an encoder-decoder "
                          "pair one prompt at a time")
    cache = copy.copy(template)
    layers, first = [], None
    for layer in cache_parts(template)[0].layers:
        if isinstance(layer, DroppedLayer):
            layers.append(layer)
            continue
        if getattr(layer, "is_sliding", False) or type(layer) not in (InPlaceLayer, DynamicLayer):
            raise PolicyError(f"batched decoding needs full-attention layers with an in-place or dynamic cache; "
                              f"this model has {type(layer).__name__} (sliding-window or static): decode its "
                              "prompts one at a time")
        layers.append(RaggedLayer(rows, capacity))
        first = first or layers[-1]
    cache.layers = [DroppedLayer(first) if isinstance(layer, DroppedLayer) else layer for layer in layers]
    return cache


def ragged_layers(cache) -> list[RaggedLayer]:
    return [layer for layer in cache.layers if isinstance(layer, RaggedLayer)]


class RowCache:
    """One row's handle on a batch's shared cache: what a runner holds as its `cache`. `n`: the row's cached
    length; `crop(-k)` is the row's rollback (nothing moves). `layers` is empty: the runner's sliding-window
    check finds none (`ragged_cache` refused them)."""

    layers: tuple = ()

    def __init__(self, slot: int):
        self.slot = slot
        self.n = 0

    def get_seq_length(self) -> int:
        return self.n

    def reset(self) -> RowCache:
        """Empty: the runner's fresh cache at the start of its row's decode."""
        self.n = 0
        return self

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative number of tokens to remove, got {tokens_to_remove}")
        self.n = max(0, self.n + tokens_to_remove)
