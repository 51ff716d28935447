"""Reuse of the slim verifier's work by the full model (docs/method.md, "When the slim tier pays").

A routed slim view whose mask keeps layers `0..k-1` computes exactly what the full model computes up
to its first dropped layer `k`. `SharedPrefix` splits both forwards there, LayerSkip-style
(early/remainder), without touching the target:

- the *trunk* (layers `0..k-1`, no final norm) runs once per position for both models; its output, the
  residual stream `h` `[1, T, H]`, is kept in a buffer and its K/V in one cache (`TrunkRunner`);
- the slim's *rest* (its kept layers `>= k`) and the full model's *rest* (layers `k..L-1`) each take
  `h` as `inputs_embeds` and keep their own caches (`RestRunner`), so an escalation starts the full
  forward at layer `k` from the slim's hidden states: the part `rho` of the full pass the slim already
  did costs nothing;
- a mask that keeps only the prefix `0..k-1` (the truncated slim, LayerSkip's early exit) has no rest
  of its own: its logits are the target's final norm and LM head applied to `h` (`ExitHead`,
  `ExitRunner`), and the whole slim pass is shared with the full model (`rho = k / L`).

Not every layout accepts a residual stream as `inputs_embeds` (GPT-2 adds position embeddings to it,
Gemma scales it), and not every head is `lm_head(norm(h))` (Gemma2 soft-caps its logits), so
`SharedPrefix.build` checks both split forwards on a probe sequence against the unsplit target and
slim view, and falls back (returns None, with the reason logged) when they do not reproduce the logits.
Pure library code: models in, views and runners out.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch import nn

from ..errors import UnsupportedArchitectureError
from .kv_cache import keep_slots, model_cache
from .runner import ModelRunner
from .seq2seq import is_encoder_decoder
from .slim import FINAL_NORMS, RoutingMask, SlimVerifier, find_layer_stack, num_decoder_layers, routed_view

log = logging.getLogger(__name__)


def prefix_length(keep_layers) -> int:
    """How many of the layers `0, 1, 2, ...` a mask keeps in a row."""
    k = 0
    while k < len(keep_layers) and keep_layers[k] == k:
        k += 1
    return k


def _cache_for(target: nn.Module, layers, kind: str, capacity: int | None):
    """The target's cache layout with a `DroppedLayer` in every slot but `layers`."""
    cache = model_cache(target, kind, capacity)
    keep_slots(cache, layers)
    return cache


# each slim view's split, built once per view (False: its layout cannot split; the reason was logged)
_SPLITS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def shared_prefix(slim: SlimVerifier) -> SharedPrefix | None:
    """The `SharedPrefix` of a slim view (built once per view), or None where the layout cannot split its
    forward (the reason is logged once)."""
    if slim not in _SPLITS:
        _SPLITS[slim] = SharedPrefix.build(slim.target, slim.mask) or False
    return _SPLITS[slim] or None


class SharedPrefix:
    """The split of `target` and its slim view at the slim's first dropped layer `k`.

    `trunk`: body view of layers `0..k-1` without the final norm (`input_ids` -> `h`); `slim_rest` and
    `target_rest`: causal-LM views of the slim's kept layers `>= k` and of layers `k..L-1`
    (`inputs_embeds=h` -> logits).
    """

    def __init__(self, target: nn.Module, keep_layers, k: int):
        n = num_decoder_layers(target)
        self.target = target
        self.k = k
        self.keep_layers = tuple(keep_layers)
        self.trunk_layers = tuple(range(k))
        self.slim_layers = tuple(i for i in keep_layers if i >= k)
        self.target_layers = tuple(range(k, n))
        self.trunk = routed_view(target, self.trunk_layers, base=True, final_norm=False)
        self.slim_rest = routed_view(target, self.slim_layers) if self.slim_layers else ExitHead(target)
        self.target_rest = routed_view(target, self.target_layers)

    @property
    def early_exit(self) -> bool:
        """True when the slim is the prefix itself: its logits are the head applied to the trunk's output."""
        return not self.slim_layers

    @classmethod
    def build(cls, target: nn.Module, mask) -> SharedPrefix | None:
        """The split for `mask` (an early exit when the mask is a prefix), or None (logged) when it does not
        keep layer 0, or the layout does not reproduce the target's or the slim's logits when split."""
        if is_encoder_decoder(target):
            log.info("reuse off: the split forward is implemented for decoder-only models")
            return None
        k = prefix_length(mask.keep_layers)
        if k == 0:
            log.info("reuse off: the mask %s does not keep layer 0, so no layer is shared", list(mask.keep_layers))
            return None
        try:
            split = cls(target, mask.keep_layers, k)
        except UnsupportedArchitectureError as err:
            log.warning("reuse off: %s", err)
            return None
        problem = split.check()
        if problem:
            log.warning("reuse off for %s: %s", type(target).__name__, problem)
            return None
        return split

    @torch.inference_mode()
    def check(self, length: int = 12) -> str | None:
        """Run a probe sequence through the split (with caches, in two chunks) and through the unsplit
        target and slim view; None when the logits agree to the dtype's precision, else what differs."""
        device = next(self.target.parameters()).device
        vocab = self.target.get_output_embeddings().weight.shape[0]
        ids = (torch.arange(length, device=device) * 7919 % max(vocab - 1, 1) + 1)[None]
        full = self.target(input_ids=ids, use_cache=False).logits.float()
        slim = SlimVerifier(self.target, RoutingMask(self.keep_layers, num_decoder_layers(self.target)))
        slim_full = slim(ids, use_cache=True).logits.float()
        trunk_cache = _cache_for(self.target, self.trunk_layers, "dynamic", None)
        rest_cache = _cache_for(self.target, self.target_layers, "dynamic", None)
        slim_cache = None if self.early_exit else _cache_for(self.target, self.slim_layers, "dynamic", None)
        rows, slim_rows = [], []
        for part in (ids[:, : length // 2], ids[:, length // 2 :]):
            h = self.trunk(input_ids=part, cache=trunk_cache, use_cache=True).last_hidden_state
            rows.append(self.target_rest(inputs_embeds=h, cache=rest_cache, use_cache=True).logits.float())
            slim_rows.append(self.slim_rest(inputs_embeds=h, cache=slim_cache, use_cache=True).logits.float())
        tol = 1e-4 if full.dtype == torch.float32 and next(self.target.parameters()).dtype == torch.float32 else 3e-2
        for who, split, whole in (("full model", torch.cat(rows, dim=1), full),
                                  ("slim", torch.cat(slim_rows, dim=1), slim_full)):
            scale = whole.abs().max().item() or 1.0
            gap = (split - whole).abs().max().item()
            if gap > tol * scale:
                return (f"splitting the {who}'s forward at layer {self.k} changes its logits by {gap:.3g} "
                        f"(max |logit| {scale:.3g}); this layout does not take its residual stream back as "
                        "inputs_embeds" + (" or its head is not lm_head(norm(h))" if who == "slim" and self.early_exit
                                           else ""))
        return None

    def new_cache(self, part: str, kind: str, capacity: int | None):
        layers = {"trunk": self.trunk_layers, "slim": self.slim_layers, "target": self.target_layers}[part]
        return _cache_for(self.target, layers, kind, capacity)


class ExitHead(nn.Module):
    """The target's final norm and LM head as a module of their own (no weight copied): the residual
    stream `h` `[B, T, H]` -> `.logits` `[B, T, V]`, the logits of an early exit after the trunk.
    Takes the keyword arguments of a causal-LM forward (`inputs_embeds`, `cache`, `logits_to_keep`)."""

    def __init__(self, target: nn.Module):
        super().__init__()
        body = target
        for name in find_layer_stack(target)[:-1]:
            body = body.get_submodule(name)
        name = next((n for n in FINAL_NORMS if n in dict(body.named_children())), None)
        if name is None:
            raise UnsupportedArchitectureError(
                f"{type(target).__name__}: no final norm named {' / '.join(FINAL_NORMS)} beside the layer stack")
        self.norm = body.get_submodule(name)
        self.head = target.get_output_embeddings()
        if self.head is None:
            raise UnsupportedArchitectureError(f"{type(target).__name__} has no output embeddings (LM head)")

    def forward(self, inputs_embeds: torch.Tensor, logits_to_keep: int = 0, **_):
        from transformers.modeling_outputs import CausalLMOutput

        h = inputs_embeds[:, -logits_to_keep:] if logits_to_keep else inputs_embeds
        return CausalLMOutput(logits=self.head(self.norm(h)))


class TrunkRunner(ModelRunner):
    """Runs the shared layers `0..k-1` once per position, for the slim and the full model alike.

    `hidden`: `[1, capacity, H]`, the residual stream after layer `k-1` at every position fed so far
    (`cached`); rolled back with the sequence like any runner's cache.
    """

    def __init__(self, model: nn.Module, new_cache: Callable, capacity: int, hidden_size: int, dtype, vocab_size: int,
                 exact_timing: bool = True, capture=None):
        super().__init__("trunk", model, new_cache, vocab_size, exact_timing)
        self.hidden = torch.zeros((1, capacity, hidden_size), dtype=dtype, device=self.device)
        # a feature drafter's: the outputs of its feature layers at every position, `[1, capacity, F*H]`
        # (`feature_drafter.TrunkFeatures` captures them during the trunk's own passes)
        self.capture = capture
        self.features = None if capture is None else torch.zeros((1, capacity, len(capture.layers) * hidden_size),
                                                                 dtype=dtype, device=self.device)

    @torch.inference_mode()
    def advance(self, ids: torch.Tensor, upto: int) -> None:
        """Make `hidden[:, :upto]` (and `features`) current: feed `ids[0, cached:upto]` through the trunk."""
        if self.cached >= upto:
            return
        with self.timed(upto - self.cached), self.capturing():
            out = self.model(input_ids=ids[:, self.cached : upto], cache=self.cache, use_cache=True)
            self.hidden[:, self.cached : upto] = out.last_hidden_state
            if self.capture is not None:  # in a batched decode the hooks saw the whole pass: this row's slice
                self.features[:, self.cached : upto] = self.capture.take(getattr(out, "batch_slice", None))
        self.tokens += upto - self.cached
        self._fed_since_trim += upto - self.cached
        self.cached = upto

    @contextmanager
    def capturing(self):
        """The feature drafter's capture on around a pass of the trunk's own (nothing without a feature drafter)."""
        if self.capture is not None:
            self.capture.capturing = True
        try:
            yield
        finally:
            if self.capture is not None:
                self.capture.capturing = False

    def close(self) -> None:
        """Remove the feature capture's hooks from the target (the end of a decode)."""
        if self.capture is not None:
            self.capture.remove()

    def prefill(self, ids: torch.Tensor, upto: int) -> None:
        with self.prefilling():
            self.advance(ids, upto)

    def forward(self, ids, upto, n_logits):  # the trunk has no head
        raise TypeError("the trunk yields hidden states: use advance()")


class RestRunner(ModelRunner):
    """The slim's or the full model's layers after the shared prefix, fed the trunk's hidden states."""

    def __init__(self, name: str, model: nn.Module, trunk: TrunkRunner, new_cache: Callable, vocab_size: int,
                 exact_timing: bool = True):
        super().__init__(name, model, new_cache, vocab_size, exact_timing)
        self.trunk = trunk

    def forward(self, ids: torch.Tensor, upto: int, n_logits: int) -> torch.Tensor:
        self.trunk.advance(ids, upto)
        return super().forward(ids, upto, n_logits)

    def _inputs(self, ids: torch.Tensor, upto: int) -> dict:
        return {"inputs_embeds": self.trunk.hidden[:, self.cached : upto]}


class ExitRunner(ModelRunner):
    """The early-exit slim (a prefix-only mask): the head applied to the trunk's hidden states. It has
    no layers and no cache of its own, so a pass costs one norm and one LM-head product per row asked
    for; the decoder layers it needs are the trunk's, computed once and reused by the full model."""

    def __init__(self, head: ExitHead, trunk: TrunkRunner, vocab_size: int, exact_timing: bool = True):
        super().__init__("slim", head, lambda: None, vocab_size, exact_timing, layers=0)
        self.trunk = trunk

    def start(self) -> None:
        self.cached = 0

    def rollback(self, n: int) -> None:
        self.cached = min(self.cached, n)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, upto: int, n_logits: int) -> torch.Tensor:
        """The exit logits `[n_logits, V]` of positions `upto-n_logits..upto-1` (the trunk advanced first)."""
        assert 0 < n_logits <= upto - self.cached, (self.name, self.cached, upto, n_logits)
        self.trunk.advance(ids, upto)
        with self.timed(n_logits):  # its cost follows the rows the head computes, not the positions advanced over
            logits = self.model(inputs_embeds=self.trunk.hidden[:, upto - n_logits : upto]).logits
            logits = logits[0, :, : self.vocab_size].float()
        self.tokens += upto - self.cached
        self.cached = upto
        return self.process(ids, upto, logits)
