"""A feature drafter on the shared trunk, EAGLE-3-style ([Li et al. 2025](https://arxiv.org/abs/2503.01840)):
one decoder layer that drafts from the target's own hidden states instead of from a model of its own.

Notation: `f_t` `[F * H]` is the target's hidden states at position `t` after each of the `F` feature layers
(low, middle and high layers of the *shared trunk*, layers `0..k-1`, the layers the slim verifier and the
full model share under reuse, `reuse.py`), `e(x)` the target's token embedding, `g_t` `[H]` the drafter's
own output at position `t`. Drafter position `t` reads the feature of position `t` and the next token,
and predicts the token after it (the target's `f_t` predicts `x_{t+1}`; the drafter, which also sees
`x_{t+1}`, predicts `x_{t+2}`):

    u_t = W_in [ fuse(f_t) ; e(x_{t+1}) ]            fuse: [F * H] -> [H], W_in: [2H] -> [H]
    g_t = layer(u_0..u_t)                            one decoder layer of the target's architecture, its own norm
    p(x_{t+2} | x_<=t+1) = softmax(lm_head(g_t))     the target's LM head, frozen and shared

At a block's start every committed position's features are the trunk's (a slim pass or a full pass ran the
trunk over them), so the drafter catches up in one parallel pass. Drafting further, the feature of a
position the trunk has not run is the drafter's own previous output: `u_t = W_in [ g_{t-1} ; e(x_{t+1}) ]`
("training-time test" trains it to draft from its own outputs, `training/feature_drafter.py`). Because
the trunk is the target's own first layers, the drafter can draft after tokens the slim settled without
any full pass, which an EAGLE head on the target's last layers cannot.

Any drafter keeps speculative decoding lossless: its logits are a proposal distribution like a draft
model's, settled by the same tests. Pure library code: modules and a runner, no files but `save`/`load`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from torch import nn

from ..errors import UnsupportedArchitectureError
from .runner import ModelRunner
from .seq2seq import text_config
from .slim import find_layer_stack, routed_config

log = logging.getLogger(__name__)

CONFIG = "feature_drafter.json"
WEIGHTS = "feature_drafter.safetensors"


def feature_layers(trunk_layers: int) -> tuple[int, ...]:
    """The low, middle and high layers of a trunk of `trunk_layers` layers whose outputs the drafter fuses
    (0-based layer indices; the last is always the trunk's last): `(1, 3, 5)` for a trunk of 6."""
    k = trunk_layers
    return tuple(sorted({max(0, round(k / 3) - 1), max(0, round(2 * k / 3) - 1), k - 1}))


class FeatureDrafter(nn.Module):
    """The drafter's own weights (`fuse`, `w_in`, one decoder layer `body` of the target's architecture)
    over the target's frozen token embedding and LM head (not registered here: not trained, not saved).

    `trunk_layers` (k): the shared trunk whose layers `feature_layers` it reads. `forward(features, tokens,
    cache)`: `features` `[B, T, F*H]` (true features) or `[B, T, H]` (its own outputs, `own=True`), `tokens`
    `[B, T]` (the next tokens) -> `(logits [B, T, V], g [B, T, H])`."""

    def __init__(self, target: nn.Module, trunk_layers: int, layers: tuple[int, ...] | None = None):
        super().__init__()
        from transformers import AutoModel

        config = text_config(target)
        self.trunk_layers = trunk_layers
        self.layers = tuple(layers if layers is not None else feature_layers(trunk_layers))
        if max(self.layers) >= trunk_layers:
            raise UnsupportedArchitectureError(f"feature layers {list(self.layers)} reach past the trunk's "
                                               f"{trunk_layers} layers")
        hidden = config.hidden_size
        self.fuse = nn.Linear(len(self.layers) * hidden, hidden, bias=False)
        self.w_in = nn.Linear(2 * hidden, hidden, bias=False)
        body_config = routed_config(config, (0,))  # one layer of the target's kind, per-layer lists cut to it
        body_config.vocab_size = 1  # it is fed embeddings: no token table of its own
        body_config.pad_token_id = None
        self.body = AutoModel.from_config(body_config)
        self.body.to(dtype=next(target.parameters()).dtype)
        # the target's, shared and frozen: kept out of this module's parameters and state dict
        self._shared = (target.get_input_embeddings(), target.get_output_embeddings())
        if self._shared[1] is None:
            raise UnsupportedArchitectureError(f"{type(target).__name__} has no output embeddings (LM head)")
        self.body.to(next(target.parameters()).device)
        self.fuse.to(next(target.parameters()).device)
        self.w_in.to(next(target.parameters()).device)

    @property
    def hidden_size(self) -> int:
        return self.w_in.out_features

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The target's token embedding `[.., H]`, its weights detached (frozen: training moves only the drafter)."""
        table = self._shared[0]
        if isinstance(table, nn.Embedding):
            return nn.functional.embedding(tokens, table.weight.detach())
        return table(tokens)

    def head(self, rows: torch.Tensor) -> torch.Tensor:
        """The target's LM head on `rows` `[.., H]` -> `[.., V]`, its weights detached."""
        head = self._shared[1]
        if isinstance(head, nn.Linear):
            return nn.functional.linear(rows, head.weight.detach(),
                                        None if head.bias is None else head.bias.detach())
        return head(rows)

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, cache=None, own: bool = False,
                logits_to_keep: int = 0):
        """`features` `[B, T, F*H]` (the trunk's, fused here) or, with `own`, `[B, T, H]` (its own outputs);
        `tokens` `[B, T]`; `cache`: the body's KV cache (its positions continue from the cache's length).
        Returns the logits `[B, T', V]` of the last `logits_to_keep` positions (0: all) and `g` `[B, T, H]`."""
        u = self.inputs(features, tokens, own)
        g = self.body(inputs_embeds=u, cache=cache, use_cache=cache is not None).last_hidden_state
        rows = g[:, -logits_to_keep:] if logits_to_keep else g
        return self.head(rows), g

    def inputs(self, features: torch.Tensor, tokens: torch.Tensor, own: bool = False) -> torch.Tensor:
        """The body's inputs `u` `[B, T, H]`: `W_in [fuse(f_t) ; e(x_{t+1})]`, or with `own` `W_in [g_{t-1} ;
        e(x_{t+1})]` (`features` then the drafter's own outputs `[B, T, H]`). Per position, no attention: the
        runner computes them per row and runs only the body over a batch."""
        f = features if own else self.fuse(features)
        return self.w_in(torch.cat([f, self.embed(tokens).to(f.dtype)], dim=-1))

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.body.config)

    def save(self, directory: Path, extra: dict | None = None) -> None:
        """`feature_drafter.json` (trunk, layers, the body's config) and `feature_drafter.safetensors` (its
        own weights) in `directory` (the target is saved apart)."""
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(directory / WEIGHTS))
        (directory / CONFIG).write_text(json.dumps({"trunk_layers": self.trunk_layers, "layers": list(self.layers),
                                                    **(extra or {})}, indent=1))


def is_feature_drafter_dir(path: str | Path) -> bool:
    return (Path(path) / CONFIG).is_file()


def load_feature_drafter(directory: str | Path, target: nn.Module) -> FeatureDrafter:
    """The feature drafter saved in `directory`, over `target`'s embedding and head (in eval mode)."""
    from safetensors.torch import load_file

    directory = Path(directory)
    meta = json.loads((directory / CONFIG).read_text())
    drafter = FeatureDrafter(target, meta["trunk_layers"], tuple(meta["layers"]))
    state = load_file(str(directory / WEIGHTS), device=str(next(target.parameters()).device))
    drafter.load_state_dict({k: v.to(next(target.parameters()).dtype) for k, v in state.items()})
    return drafter.eval()


class TrunkFeatures:
    """Captures the outputs of the target's decoder layers `layers` while `capturing` (forward hooks on those
    layer modules, the target untouched; the trunk runner turns it on around its own passes only, since the
    full model's and the slim's rests run other layers of the same stack)."""

    def __init__(self, target: nn.Module, layers: tuple[int, ...]):
        stack = target
        for name in find_layer_stack(target):
            stack = stack.get_submodule(name)
        self.layers = layers
        self.outputs: dict[int, torch.Tensor] = {}
        self.capturing = False
        self._handles = [stack[i].register_forward_hook(self._hook(i)) for i in layers]

    def _hook(self, i: int):
        def keep(module, args, output):
            if self.capturing:
                self.outputs[i] = output[0] if isinstance(output, tuple) else output
        return keep

    def take(self, batch_slice: tuple[int, int] | None = None) -> torch.Tensor:
        """The captured outputs concatenated over the layers: `[B, T, F*H]`; of a batched pass (`batch_slice`
        `(r, c)`: its row `r` from column `c`, `batching._Output`) this row's `[1, T', F*H]`."""
        out = torch.cat([self.outputs[i] for i in self.layers], dim=-1)
        self.outputs = {}
        if batch_slice is not None:
            r, c = batch_slice
            out = out[r : r + 1, c:]
        return out

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


class FeatureDraftRunner(ModelRunner):
    """Runs a `FeatureDrafter` over the session's sequence, reading the trunk runner's features.

    `cached` counts the sequence tokens the drafter has consumed: drafter positions `0..P-1` read tokens
    `x_1..x_P` (and `x_0` through `f_0`), so `cached = P + 1` (0 before any). `exact` is how many leading
    positions were fed true trunk features; a rollback also drops every position fed its own output, so the
    next block re-reads the trunk's features there. `forward(ids, upto, 1)` returns the logits of `x_upto`."""

    def __init__(self, drafter: FeatureDrafter, trunk, vocab_size: int, exact_timing: bool = True):
        # its own layout name: the cost model prices a pass by `name:layers`, and a one-layer draft model is `draft:1`.
        # Its model is the body (the one decoder layer, the only part that attends): the inputs `u` and the LM head
        # are per position, computed on this row's tensors, so a batched decode shares the body's passes only
        super().__init__("feature", drafter.body, drafter.new_cache, vocab_size, exact_timing, layers=1)
        self.drafter = drafter
        self.trunk = trunk
        self.positions = 0
        self.exact = 0
        self.g = None  # [1, 1, H]: its output at position positions-1

    def start(self) -> None:
        self.cache = self._new_cache()
        self._window = None
        self._trim = False
        self.positions = self.exact = 0
        self.cached = 0
        self.g = None

    def rollback(self, n: int) -> None:
        keep = min(self.positions, max(0, n - 1), self.exact)
        if keep < self.positions:
            self.cache.crop(keep - self.positions)  # transformers 5: a negative count drops that many
            self.positions = keep
            self.g = None
        self.cached = self.positions + 1 if self.positions else 0

    def prefill(self, ids: torch.Tensor, upto: int) -> None:
        """The prompt's features first (the trunk's prefill), then the drafter over them."""
        self.trunk.prefill(ids, upto)
        if upto >= 2:
            with self.prefilling():
                self._feed(ids, upto)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, upto: int, n_logits: int) -> torch.Tensor:
        assert n_logits == 1, "a feature drafter proposes one token per pass"
        if upto < 2:  # x_1 after a one-token prompt: no position to draft it from; a uniform proposal (still lossless)
            return self.process(ids, upto, torch.zeros((1, self.vocab_size), device=self.device))
        logits = self._feed(ids, upto)
        return self.process(ids, upto, logits[-1:])

    def _feed(self, ids: torch.Tensor, upto: int) -> torch.Tensor:
        """Feed drafter positions `positions..upto-2`: those the trunk has run in one pass with their true
        features, then (drafting on) one at a time from its own outputs. Returns the logits of the last position
        fed, `[1, V]`."""
        last = upto - 2  # the position whose output predicts x_upto
        assert last >= self.positions, (self.positions, upto)
        logits = None
        true_end = min(last + 1, self.trunk.cached)
        if true_end <= self.positions and self.g is None:  # no feature of its own to go on: the trunk's
            self.trunk.advance(ids, self.positions + 1)
            true_end = min(last + 1, self.trunk.cached)
        if true_end > self.positions:
            a, b = self.positions, true_end
            with self.timed(b - a):  # the head on the last row only: the next draft token's
                logits, g = self._pass(self.drafter.inputs(self.trunk.features[:, a:b], ids[:, a + 1 : b + 1]))
            self._advanced(b - a, g, exact=True)
        while self.positions <= last:
            t = self.positions
            with self.timed(1):
                logits, g = self._pass(self.drafter.inputs(self.g, ids[:, t + 1 : t + 2], own=True))
            self._advanced(1, g, exact=False)
        return logits

    def _pass(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The body over `u` `[1, T, H]` on this row's cache, then the LM head on its last position: returns the
        float32 logits `[1, V]` and `g` `[1, T, H]` (as `FeatureDrafter.forward` with `logits_to_keep=1`)."""
        g = self.model(inputs_embeds=u, cache=self.cache, use_cache=True).last_hidden_state
        return self.drafter.head(g[:, -1:])[0, :, : self.vocab_size].float(), g

    def _advanced(self, count: int, g: torch.Tensor, exact: bool) -> None:
        if exact and self.exact == self.positions:
            self.exact += count
        self.positions += count
        self.tokens += count
        self.g = g[:, -1:]
        self.cached = self.positions + 1
