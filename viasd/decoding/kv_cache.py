"""KV caches for the decode loop: which kind a runner gets, and the in-place growing layer.

Three kinds (`DecodePolicy.cache`, `policy.CACHE_KINDS`):
- `inplace` (default): each full-attention layer keeps key/value buffers `[B, H, capacity, D]` allocated
  once for the whole decode and written in place; attention sees only the filled prefix
  `[B, H, n, D]` (a view). Per-token cost grows only with the attention itself: no copy of the cache per
  token (transformers' `DynamicLayer` concatenates, which copies the whole cache on every forward) and no
  attention over empty slots (a `StaticLayer` attends over its whole buffer under a mask).
- `dynamic`: transformers' `DynamicCache` unchanged (what `generate` uses).
- `static`: transformers' `StaticCache` preallocated for the decode's capacity.

Under `inplace`, layers of other kinds (sliding windows, linear attention, ...) keep the classes
`DynamicCache` gives them, so every architecture `DynamicCache` supports is supported; `static` refuses
sliding-window models.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import DummyLayer, DynamicLayer

from ..errors import PolicyError
from .policy import CACHE_KINDS, DEFAULT_CACHE
from .seq2seq import decoder_depth, is_encoder_decoder


class InPlaceLayer(DynamicLayer):
    """A `DynamicLayer` whose states live in buffers `[B, H, capacity, D]` filled in place.

    `keys`/`values` are views `[B, H, n, D]` of the first `n` positions, so everything that reads a
    `DynamicLayer` (masks, `get_seq_length`, `crop`) reads this one alike. A forward that would pass
    `capacity` reallocates to at least twice the size (amortised O(1) per token), so the capacity is a
    hint, not a limit. `crop(-k)` only moves `n` back: the next update overwrites the dropped states.
    """

    def __init__(self, capacity: int = 256, **kwargs):
        super().__init__(**kwargs)
        self.capacity = max(1, int(capacity))
        self.n = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._k = key_states.new_empty((*key_states.shape[:2], self.capacity, key_states.shape[-1]))
        self._v = value_states.new_empty((*value_states.shape[:2], self.capacity, value_states.shape[-1]))
        self.n = 0
        self._views()
        self.is_initialized = True

    def _views(self) -> None:
        self.keys = self._k[..., : self.n, :]
        self.values = self._v[..., : self.n, :]

    def _grow(self, needed: int) -> None:
        self.capacity = max(needed, 2 * self.capacity)
        k = self._k.new_empty((*self._k.shape[:2], self.capacity, self._k.shape[-1]))
        v = self._v.new_empty((*self._v.shape[:2], self.capacity, self._v.shape[-1]))
        k[..., : self.n, :] = self._k[..., : self.n, :]
        v[..., : self.n, :] = self._v[..., : self.n, :]
        self._k, self._v = k, v

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write `key_states`/`value_states` `[B, H, t, D]` at positions `n..n+t-1`; return the views `[B, H, n+t, D]`."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t = key_states.shape[-2]
        if self.n + t > self.capacity:
            self._grow(self.n + t)
        self._k[..., self.n : self.n + t, :] = key_states
        self._v[..., self.n : self.n + t, :] = value_states
        self.n += t
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.n if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative number of tokens to remove, got {tokens_to_remove}")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        self.n = max(0, self.n + tokens_to_remove)
        self._views()

    def reset(self) -> None:
        self._k = self._v = None
        self.n = 0
        super().reset()

    def _map_batch(self, fn) -> None:
        if self.is_initialized:
            self._k, self._v = fn(self._k), fn(self._v)
            self._views()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map_batch(lambda t: t[indices, ...])

    def offload(self) -> None:
        self._map_batch(lambda t: t.to("cpu", non_blocking=True))

    def prefetch(self) -> None:
        if self.is_initialized and self._k.device != self.device:
            self._map_batch(lambda t: t.to(self.device, non_blocking=True))


def model_cache(model: nn.Module, kind: str = DEFAULT_CACHE, capacity: int | None = None):
    """A fresh cache of `kind` for `model`, sized for `capacity` positions (prompt + new + block).

    `inplace`: `DynamicCache`'s layer layout with every plain full-attention layer an `InPlaceLayer`;
    `dynamic`: `DynamicCache`; `static`: `StaticCache(max_cache_len=capacity)`.
    """
    from transformers import DynamicCache, StaticCache

    if kind not in CACHE_KINDS:
        raise PolicyError(f"cache must be one of {', '.join(CACHE_KINDS)}, got {kind!r}")
    if kind != "dynamic" and capacity is None:
        raise PolicyError(f"cache={kind!r} needs the decode's capacity (positions to preallocate)")
    if is_encoder_decoder(model):
        return _encoder_decoder_cache(model, kind, capacity)
    if kind == "static":
        cache = StaticCache(config=model.config, max_cache_len=capacity)
        if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
            raise PolicyError("cache='static' does not support sliding-window attention models; "
                              "use cache='inplace' or 'dynamic'")
        return cache
    cache = DynamicCache(config=model.config)
    if kind == "inplace":
        cache.layers = [InPlaceLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def _encoder_decoder_cache(model: nn.Module, kind: str, capacity: int | None):
    """An `EncoderDecoderCache` with one slot per *decoder* layer in each part: the self-attention part
    of `kind` (`inplace` or `dynamic`), the cross-attention part dynamic (filled once, by the first pass)."""
    from transformers import DynamicCache, EncoderDecoderCache

    if kind == "static":
        raise PolicyError("cache='static' is not supported for encoder-decoder models; use cache='inplace' or 'dynamic'")
    n = decoder_depth(model.config)
    self_attention, cross_attention = DynamicCache(), DynamicCache()
    self_attention.layers = [InPlaceLayer(capacity) if kind == "inplace" else DynamicLayer() for _ in range(n)]
    cross_attention.layers = [DynamicLayer() for _ in range(n)]
    return EncoderDecoderCache(self_attention, cross_attention)


def cache_parts(cache) -> list:
    """The layer-slotted caches inside `cache`: itself, or an `EncoderDecoderCache`'s two parts."""
    return [cache.self_attention_cache, cache.cross_attention_cache] if hasattr(cache, "self_attention_cache") else [cache]


class DroppedLayer(DummyLayer):
    """A dropped layer's slot: stores nothing, and reports the sequence length of `source`, a kept slot.

    Transformers reads a cache's length from slot 0 (`Cache.get_seq_length()` places the positions and the
    masks). Before 5.25 it skipped a `DummyLayer` in slot 0 for the first real one; since 5.25 it asks slot 0
    itself, so a slot 0 that a routing mask drops must answer for the kept slots.
    """

    def __init__(self, source):
        super().__init__()
        self.source = source

    def get_seq_length(self) -> int:
        return self.source.get_seq_length()

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.source.get_mask_sizes(query_length)


def keep_slots(cache, keep) -> None:
    """Put a `DroppedLayer` (stores nothing) in every slot of `cache` whose layer index is not in `keep`.

    `keep` must name at least one slot of each part: the dropped slots report the first kept one's length.
    """
    keep = set(keep)
    for part in cache_parts(cache):
        first = min((i for i in keep if i < len(part.layers)), default=None)
        if first is None:
            raise ValueError(f"a routed cache keeps none of its {len(part.layers)} slots")
        source = part.layers[first]
        part.layers = [layer if i in keep else DroppedLayer(source) for i, layer in enumerate(part.layers)]
