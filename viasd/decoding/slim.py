"""The routed slim verifier `q'`: the target run with only the decoder layers its mask keeps.

docs/method.md: embeddings, final norm and LM head are shared with the target and no weight is copied,
so the slim verifier's only memory overhead is its own KV cache.

How the view is built (explicitly, never by mutating the target):
- the decoder layer stack is found by inspecting the model: the one `nn.ModuleList` whose length is
  the config's `num_hidden_layers` and whose blocks carry an attention `layer_idx` (Llama, Mistral,
  Qwen2/3, Gemma2, Phi-3: `model.layers`; GPT-2: `transformer.h`; GPT-NeoX: `gpt_neox.layers`;
  OPT: `model.decoder.layers`);
- every module on the path from the root to that list is re-instantiated as a *view*: a new object
  of the same class holding the same children and tensors in child tables of its own
  (`module_views.view_of`: a plain `copy.copy` would share them and so replace the layer list of the
  target too);
- the list itself is replaced, in the view only, by a new `ModuleList` of the kept blocks;
- the view gets its own config: a deep copy of the target's with `num_hidden_layers = len(keep)` and
  every per-layer list (e.g. Gemma2's `layer_types`) restricted to the kept layers, so that forward
  loops indexing `config.layer_types[i]` by position pick the kept layer's attention type;
- each kept block keeps its original `layer_idx`, so its KV cache lives in the same slot as in the
  target: the view's cache (`new_cache`) has the target's `L` slots, with a `DroppedLayer` (stores
  nothing) in every dropped slot.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from ..errors import MaskError, UnsupportedArchitectureError
from .kv_cache import keep_slots, model_cache
from .module_views import install_output_hooks, view_of
from .seq2seq import decoder_depth, decoder_depth_key, encoder_depth, is_encoder_decoder, text_config


def decoder_config(model: nn.Module):
    """The config that describes the decoder layer stack (`seq2seq.text_config`)."""
    return text_config(model)


def num_decoder_layers(model: nn.Module) -> int:
    """Decoder layers of `model` (an encoder-decoder model's decoder, not its encoder)."""
    config = decoder_config(model)
    n = decoder_depth(config)
    if not isinstance(n, int) or n <= 0:
        raise UnsupportedArchitectureError(
            f"{type(model).__name__}: its config has no positive `num_hidden_layers`, so its decoder layer "
            "stack cannot be routed"
        )
    return n


def _is_decoder_block(module: nn.Module) -> bool:
    return any(isinstance(getattr(m, "layer_idx", None), int) for m in module.modules())


def find_layer_stack(model: nn.Module) -> tuple[str, ...]:
    """Attribute path from `model` to its decoder layer `ModuleList`, e.g. `("model", "layers")`.

    Raises UnsupportedArchitectureError when no unique stack of `num_hidden_layers` attention blocks
    is found (an unknown layout). For an encoder-decoder model it is the decoder's stack.
    """
    n = num_decoder_layers(model)
    found = [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList)
        and len(module) == n
        and all(type(block) is type(module[0]) for block in module)
        and _is_decoder_block(module[0])
    ]
    if is_encoder_decoder(model):  # the decoder's stack, not the encoder's
        found = [name for name in found if "decoder" in name.split(".")]
    if len(found) != 1:
        what = "no" if not found else f"{len(found)} ({', '.join(found)})"
        raise UnsupportedArchitectureError(
            f"{type(model).__name__}: found {what} candidate decoder layer stacks of {n} attention blocks; "
            "viasd routes the decoder stack of causal LMs (Llama, Mistral, Qwen2/3, Gemma2, Phi-3, "
            "GPT-2, GPT-NeoX, OPT, ...) and of encoder-decoder models (T5, BART, ...)"
        )
    return tuple(found[0].split("."))


def num_encoder_layers(model: nn.Module) -> int:
    """Encoder layers of an encoder-decoder `model`; UnsupportedArchitectureError for a decoder-only one."""
    n = encoder_depth(model.config)
    if not isinstance(n, int) or n <= 0:
        raise UnsupportedArchitectureError(
            f"{type(model).__name__} has no encoder (or its config gives no encoder depth): only an encoder-decoder "
            "target's slim can skip encoder layers")
    return n


def find_encoder_stack(model: nn.Module) -> tuple[str, ...]:
    """Attribute path from an encoder-decoder `model` to its encoder layer `ModuleList` (T5:
    `("encoder", "block")`, BART: `("model", "encoder", "layers")`)."""
    n = num_encoder_layers(model)
    found = [name for name, module in model.named_modules()
             if isinstance(module, nn.ModuleList) and len(module) == n and "encoder" in name.split(".")
             and all(type(block) is type(module[0]) for block in module)]
    if len(found) != 1:
        what = "no" if not found else f"{len(found)} ({', '.join(found)})"
        raise UnsupportedArchitectureError(
            f"{type(model).__name__}: found {what} candidate encoder layer stacks of {n} blocks")
    return tuple(found[0].split("."))


@dataclass(frozen=True)
class RoutingMask:
    """Which of the target's `num_layers` decoder layers the slim verifier keeps (sorted, unique), and for
    an encoder-decoder target optionally which of its `encoder_num_layers` encoder layers it runs
    (`encoder_keep_layers`; None: the target's whole encoder, whose outputs it shares)."""

    keep_layers: tuple[int, ...]
    num_layers: int
    encoder_keep_layers: tuple[int, ...] | None = None
    encoder_num_layers: int | None = None

    def with_encoder(self, layers, encoder_num_layers: int, source: str = "mask") -> RoutingMask:
        """This mask with encoder layers `layers` kept (None or all of them: the target's encoder, shared).
        Layer 0 must stay: T5 computes the relative position bias every later layer reads there."""
        if layers is None:
            return RoutingMask(self.keep_layers, self.num_layers)
        enc = RoutingMask.from_layers(layers, encoder_num_layers, source=source, kind="encoder")
        if 0 not in enc.keep_layers:
            raise MaskError(f"{source}: the encoder layers kept must include layer 0 (T5 computes the position bias "
                            "every later layer reads there)")
        if len(enc.keep_layers) == encoder_num_layers:
            return RoutingMask(self.keep_layers, self.num_layers)
        return RoutingMask(self.keep_layers, self.num_layers, enc.keep_layers, encoder_num_layers)

    @classmethod
    def from_layers(cls, layers, num_layers: int, source: str = "mask", kind: str = "decoder") -> RoutingMask:
        """Validate a list of layer indices; errors name `source` (a file name or option)."""
        if not isinstance(layers, (list, tuple)) or not layers:
            raise MaskError(f"{source}: the mask keeps no layers; list at least one {kind} layer to keep")
        seen: set[int] = set()
        for layer in layers:
            if isinstance(layer, bool) or not isinstance(layer, int):
                raise MaskError(f"{source}: layer {layer!r} is not an integer layer index")
            if not 0 <= layer < num_layers:
                raise MaskError(
                    f"{source}: layer {layer} is out of range for a target with {num_layers} {kind} layers "
                    f"(valid: 0..{num_layers - 1})"
                )
            if layer in seen:
                raise MaskError(f"{source}: layer {layer} is listed twice")
            seen.add(layer)
        return cls(tuple(sorted(seen)), num_layers)

    @classmethod
    def from_json(cls, path: str | Path, num_layers: int) -> RoutingMask:
        """Load `{"keep_layers": [...], ...}` as written by the mask search."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise MaskError(f"mask file {path} does not exist") from None
        except (OSError, json.JSONDecodeError) as err:
            raise MaskError(f"mask file {path} is not readable JSON: {err}") from None
        if not isinstance(data, dict) or "keep_layers" not in data:
            raise MaskError(f'mask file {path} has no "keep_layers" list')
        mask = cls.from_layers(data["keep_layers"], num_layers, source=f"mask file {path}")
        if data.get("encoder_keep_layers") is not None:
            if not isinstance(data.get("encoder_num_layers"), int):
                raise MaskError(f'mask file {path}: "encoder_keep_layers" needs "encoder_num_layers", the encoder\'s depth')
            mask = mask.with_encoder(data["encoder_keep_layers"], data["encoder_num_layers"], source=f"mask file {path}")
        return mask

    @classmethod
    def parse(cls, text: str, num_layers: int) -> RoutingMask:
        """Parse `"0,2,5"` (the `--keep-layers` option)."""
        try:
            layers = [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise MaskError(f"--keep-layers {text!r}: expected comma-separated layer indices like 0,2,5") from None
        return cls.from_layers(layers, num_layers, source=f"--keep-layers {text}")

    @property
    def keep_ratio(self) -> float:
        return len(self.keep_layers) / self.num_layers


def routed_config(config, keep: tuple[int, ...]):
    """A copy of `config` describing the kept layers only; the target's config is left untouched."""
    depth = decoder_depth_key(config) or "num_hidden_layers"  # an encoder-decoder model: its decoder's depth
    n = getattr(config, depth)
    routed = copy.deepcopy(config)
    for key, value in vars(config).items():
        if isinstance(value, (list, tuple)) and len(value) == n and not key.startswith("_"):
            setattr(routed, key, type(value)(value[i] for i in keep))
    setattr(routed, depth, len(keep))
    return routed


def routed_view(target: nn.Module, keep, config=None, base: bool = False, final_norm: bool = True,
                encoder_keep=None) -> nn.Module:
    """A view of `target` (no weight copied, the target untouched) that runs the decoder layers `keep`
    (original indices, in order; each keeps its `layer_idx` and so its KV-cache slot).

    `base=True` returns the view of the decoder body (the module holding the layer stack, e.g.
    `LlamaModel`: hidden states out, no LM head); `final_norm=False` replaces the body's final norm by
    an identity in the view, so the output is the residual stream after the last kept layer.
    `encoder_keep` (an encoder-decoder target): the view's encoder runs only these encoder layers (a view
    of the encoder path too; the target's encoder is untouched). Raises UnsupportedArchitectureError
    when the final norm cannot be found by name.
    """
    path = find_layer_stack(target)
    config = config if config is not None else routed_config(decoder_config(target), tuple(keep))
    install_output_hooks(target, path)
    root = view_of(target)
    parent = root
    for name in path[:-1]:
        child = view_of(parent.get_submodule(name))
        setattr(parent, name, child)
        parent = child
    stack = parent.get_submodule(path[-1])
    setattr(parent, path[-1], nn.ModuleList([stack[i] for i in keep]))
    if not final_norm:
        name = next((n for n in FINAL_NORMS if n in dict(parent.named_children())), None)
        if name is None:
            raise UnsupportedArchitectureError(
                f"{type(target).__name__}: no final norm named {' / '.join(FINAL_NORMS)} beside the layer stack")
        setattr(parent, name, nn.Identity())
    # Modules on the path whose config describes the stack read the routed copy instead.
    text_config = decoder_config(target)
    node = root
    for name in (None, *path[:-1]):
        node = node if name is None else node.get_submodule(name)
        if getattr(node, "config", None) is text_config:
            node.config = config
    if encoder_keep is not None:
        _route_encoder(root, target, tuple(encoder_keep))
    return parent if base else root


def _route_encoder(root: nn.Module, target: nn.Module, keep: tuple[int, ...]) -> None:
    """Within the view `root` of `target`, a view of every module on the path to the encoder stack (those
    the decoder's routing already re-instantiated are views already) holding only the `keep` blocks."""
    path = find_encoder_stack(target)
    node, original = root, target
    for name in path[:-1]:
        original = original.get_submodule(name)
        child = node.get_submodule(name)
        if child is original:  # still the target's own module: view it before changing it
            child = view_of(child)
            setattr(node, name, child)
        node = child
    stack = node.get_submodule(path[-1])
    setattr(node, path[-1], nn.ModuleList([stack[i] for i in keep]))


# names of the final norm applied after the decoder layer stack (Llama/Mistral/Qwen/Gemma: norm; Phi:
# final_layernorm; GPT-2: ln_f; OPT / GPT-NeoX: final_layer_norm)
FINAL_NORMS = ("norm", "final_layernorm", "ln_f", "final_layer_norm")


class SlimVerifier:
    """The target routed through `mask`: `.model` is a causal LM module sharing the target's weights.

    `model(input_ids: LongTensor[B, T], cache=self.new_cache(), ...)` returns logits `[B, T, V]` over the
    target's vocabulary, computed by the kept layers only.
    """

    def __init__(self, target: nn.Module, mask: RoutingMask):
        n = num_decoder_layers(target)
        if mask.num_layers != n:
            raise MaskError(f"the mask was made for {mask.num_layers} decoder layers but the target has {n}")
        if mask.encoder_keep_layers is not None and mask.encoder_num_layers != num_encoder_layers(target):
            raise MaskError(f"the mask was made for {mask.encoder_num_layers} encoder layers but the target has "
                            f"{num_encoder_layers(target)}")
        self.mask = mask
        self.target = target
        self.config = routed_config(decoder_config(target), mask.keep_layers)
        self.model = routed_view(target, mask.keep_layers, self.config, encoder_keep=mask.encoder_keep_layers)

    def __call__(self, input_ids, cache=None, **kwargs):
        """Forward through the kept layers: `input_ids` `[B, T]` -> output with `.logits` `[B, T, V]`.

        Without a `cache`, a fresh routed one is used (the view's own `DynamicCache` default would have
        the routed config's slot count, which a kept block's original `layer_idx` may exceed).
        """
        return self.model(input_ids=input_ids, cache=self.new_cache() if cache is None else cache, **kwargs)

    def new_cache(self, kind: str = "dynamic", capacity: int | None = None):
        """The target's cache layout (`kv_cache.model_cache`) with a `DroppedLayer` in each dropped layer's slot.

        Kept blocks write to their own `layer_idx` slot; sequence length and mask sizes are read from the
        first kept slot (each `DroppedLayer` answers for it).
        """
        cache = model_cache(self.target, kind, capacity)
        keep_slots(cache, self.mask.keep_layers)
        return cache

    @property
    def name(self) -> str:
        encoder = self.mask.encoder_keep_layers
        return ("slim[" + ",".join(map(str, self.mask.keep_layers)) + "]"
                + ("" if encoder is None else "enc[" + ",".join(map(str, encoder)) + "]"))


def evenly_spaced_mask(num_layers: int, keep: int) -> RoutingMask:
    """`keep` layers spread over the stack, always keeping layer 0 (`every_other` when keep = L/2)."""
    if not 1 <= keep <= num_layers:
        raise MaskError(f"cannot keep {keep} of {num_layers} layers")
    step = num_layers / keep
    return RoutingMask.from_layers(sorted({int(math.floor(i * step)) for i in range(keep)}), num_layers)


def shares_storage(slim: SlimVerifier) -> bool:
    """True when every tensor of the slim view is a tensor of the target (no copy was made)."""
    target_ptrs = {t.data_ptr() for t in slim.target.parameters()} | {b.data_ptr() for b in slim.target.buffers()}
    return all(t.data_ptr() in target_ptrs for t in slim.model.parameters())


__all__ = [
    "RoutingMask",
    "SlimVerifier",
    "find_encoder_stack",
    "find_layer_stack",
    "num_decoder_layers",
    "num_encoder_layers",
    "evenly_spaced_mask",
    "shares_storage",
]
