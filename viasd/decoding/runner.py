"""A model with its own KV cache over the shared token sequence, and counters for its work."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import contextmanager

import torch
from torch import nn

from .kv_cache import cache_parts
from .seq2seq import decoder_depth, text_config

log = logging.getLogger(__name__)


class ModelRunner:
    """Runs one causal LM (target, draft or a routed slim view) incrementally.

    `cached` is how many tokens of the sequence are in the KV cache. `forward(ids, upto, n)` feeds the
    tokens `ids[0, cached:upto]` in one parallel pass and returns the logits of the last `n` of them;
    `rollback(n)` drops cache entries past position `n` exactly (`DynamicCache.crop(-k)`), so a
    rejected draft leaves no trace. Work per call grows with the tokens fed, not with the sequence.
    """

    def __init__(self, name: str, model: nn.Module, new_cache: Callable, vocab_size: int, exact_timing: bool = True,
                 layers: int | None = None):
        self.name = name
        self.model = model
        self._new_cache = new_cache
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        self._sync = exact_timing and self.device.type == "cuda"
        self.cache = None
        self.cached = 0
        self.tokens = 0
        self.widths: dict[int | str, list] = {}  # `record`: width -> [passes, seconds]; "prefill" for the prompt's pass
        self._prefilling = False
        self._trim = False
        # decoder layers a pass runs (`layers`: a model that is not a transformers model, e.g. an exit head)
        self.layers = (decoder_depth(text_config(model)) or 0) if layers is None else layers
        # an encoder-decoder model: the prompt's encoder outputs, set by the session once the prompt is encoded
        self.encoder_outputs = None
        # the generation config's logits processors (`processors.RowProcessor`), set by the session
        self.processors = None

    def start(self) -> None:
        """A fresh, empty cache (sliding-window layers record the past so that rollback is exact)."""
        self.cache = self._new_cache()
        windows = [layer.sliding_window for layer in cache_parts(self.cache)[0].layers if getattr(layer, "is_sliding", False)]
        self._window = min(windows) if windows else None
        self._trim = self._window is not None
        if self._trim:
            self.cache.activate_past_recording()
        self.cached = 0
        self._fed_since_trim = 0

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, upto: int, n_logits: int) -> torch.Tensor:
        """Feed `ids[0, cached:upto]` (`ids`: LongTensor `[1, capacity]`); return float32 logits `[n_logits, V]`."""
        count = upto - self.cached
        assert 0 < n_logits <= count, (self.name, self.cached, upto, n_logits)
        inputs = self._inputs(ids, upto)
        if self.encoder_outputs is None:
            inputs["logits_to_keep"] = n_logits
        with self.timed(count):
            out = self.model(**inputs, cache=self.cache, use_cache=True)
            logits = out.logits[0, -n_logits:, : self.vocab_size].float()
        self.cached = upto
        self._fed_since_trim += count
        self.tokens += count
        return self.process(ids, upto, logits)

    def prefill(self, ids: torch.Tensor, upto: int) -> None:
        """Feed the prompt's `ids[0, :upto]` (all but its last token) in one pass, recorded as the prefill: the
        decoding passes after it are then each model's own work per generated token, whatever the method."""
        with self.prefilling():
            self.forward(ids, upto, 1)

    @contextmanager
    def prefilling(self):
        """Passes run inside are recorded as the prompt's prefill (`timed`)."""
        self._prefilling = True
        try:
            yield
        finally:
            self._prefilling = False

    def process(self, ids: torch.Tensor, upto: int, logits: torch.Tensor) -> torch.Tensor:
        """The rows `[n, V]` of positions `upto-n..upto-1`, each through the generation config's processors
        with its own prefix (unchanged without processors)."""
        return logits if self.processors is None else self.processors(ids, upto, logits)

    @contextmanager
    def timed(self, width: int):
        """Time the pass run inside the block, `width` tokens (rows, for a head), and count it (`record`); a
        pass of `prefill` is the prompt's. On CUDA with exact timing the device is synchronised before and
        after, so the seconds are the pass's own."""
        prefill = self._prefilling
        if self._sync:
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        yield
        if self._sync:
            torch.cuda.synchronize(self.device)
        self.record(width, time.perf_counter() - start, prefill=prefill)

    def record(self, width: int, seconds: float, prefill: bool) -> None:
        """Count one pass of `width` tokens (rows, for a head) that took `seconds`: the prompt's prefill is
        kept apart, since the cost model prices the decoding passes."""
        entry = self.widths.setdefault("prefill" if prefill else width, [0, 0.0])
        entry[0] += 1
        entry[1] += seconds

    @property
    def passes(self) -> int:
        """Decoding passes: the prompt's prefill is not one (it is `widths["prefill"]`)."""
        return sum(n for width, (n, _) in self.widths.items() if width != "prefill")

    @property
    def seconds(self) -> float:
        return sum(s for _, s in self.widths.values())

    def _inputs(self, ids: torch.Tensor, upto: int) -> dict:
        """What the model is fed for positions `cached..upto-1`: their token ids (an encoder-decoder model:
        as decoder inputs, beside the prompt's encoder outputs)."""
        if self.encoder_outputs is not None:
            return {"decoder_input_ids": ids[:, self.cached : upto], "encoder_outputs": self.encoder_outputs}
        return {"input_ids": ids[:, self.cached : upto]}

    def rollback(self, n: int) -> None:
        """Keep the first `n` cached positions (nothing to drop when `n >= cached`).

        Sliding-window layers keep every state fed since the last rollback (`record_past`) and are
        trimmed back to their window here, so a rollback may drop anything fed since the previous one.
        Dropping more than that, once the sequence is longer than the window (cascade_sd's draft and
        slim caches, after the full model rejects tokens of earlier rounds), cannot be undone in
        place: the cache is rebuilt from the sequence on the next forward instead (exact, costlier).
        """
        drop = max(0, self.cached - n)
        if self._trim and drop > self._fed_since_trim and self.cached >= self._window:
            log.debug("%s: rollback of %d past a sliding window; re-encoding the prefix", self.name, drop)
            self.start()
            return
        if drop or (self._trim and self.cached):
            self.cache.crop(-drop)
            self.cached -= drop
            self._fed_since_trim = 0
