"""Encoder-decoder (seq2seq) models in the decode loop: what differs from a decoder-only causal LM.

- The prompt is the *encoder's* input. Each model (target, draft, an independent intermediate model)
  encodes it once per decode (`encode`); the routed slim shares the target's encoder, as it shares its
  embeddings and head, so it reuses the target's encoder outputs. The decoded sequence starts with the
  model's `decoder_start_token_id` and holds only decoder tokens.
- Every decoder pass reads the encoder outputs; the decoder's cache is an `EncoderDecoderCache`: the
  self-attention part grows and is rolled back like a causal LM's, the cross-attention K/V are computed
  by the first pass and reused by every later one.
- By default the routed slim runs the target's whole encoder (its outputs are the target's, computed
  once). A mask may also name encoder layers (`RoutingMask.encoder_keep_layers`, the `dimr.encoder_keep`
  option): the slim then has an encoder of its own, a view running those layers, which encodes the
  prompt once more per decode. Per generated token it costs and saves nothing (the encoder runs once
  per prompt either way); it changes what the slim's cross-attention reads.
- The decoder layer stack is the one the routed slim verifier selects from (T5: `decoder.block`,
  BART: `model.decoder.layers`); its size is `num_decoder_layers` / `decoder_layers`, not
  `num_hidden_layers` (T5's encoder depth).
Pure library code: no files, no tracking.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import PolicyError

# config keys holding the decoder's depth, by layout (T5 / MT5 / UMT5: num_decoder_layers; BART, mBART,
# Marian, Pegasus: decoder_layers)
DECODER_DEPTH_KEYS = ("num_decoder_layers", "decoder_layers")


def is_encoder_decoder(model: nn.Module) -> bool:
    return bool(getattr(model.config, "is_encoder_decoder", False))


def text_config(model: nn.Module):
    """The config that describes the decoder stack: the text config of a multimodal wrapper, the model's
    own config for an encoder-decoder model (whose `get_text_config(decoder=True)` is a derived config
    with default sizes, not this model's)."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False) or not hasattr(config, "get_text_config"):
        return config
    return config.get_text_config(decoder=True)


def decoder_depth_key(config) -> str | None:
    """The config key of an encoder-decoder model's decoder depth (None for a decoder-only config)."""
    if not getattr(config, "is_encoder_decoder", False):
        return None
    return next((k for k in DECODER_DEPTH_KEYS if isinstance(getattr(config, k, None), int)), None)


def decoder_start_id(model: nn.Module) -> int:
    """The token every decoded sequence starts with (the generation config's, else the model config's)."""
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "decoder_start_token_id", None)
        if isinstance(value, int):
            return value
    raise PolicyError(f"{type(model).__name__} has no decoder_start_token_id in its config or generation config; "
                      "an encoder-decoder model needs one to start decoding")


# config keys holding the encoder's depth (BART and kin: encoder_layers; T5 / MT5 / UMT5: num_layers)
ENCODER_DEPTH_KEYS = ("encoder_layers", "num_layers")


def encoder_depth(config) -> int | None:
    """Encoder layers of an encoder-decoder config (None for a decoder-only one)."""
    if not getattr(config, "is_encoder_decoder", False):
        return None
    return next((getattr(config, k) for k in ENCODER_DEPTH_KEYS if isinstance(getattr(config, k, None), int)), None)


def decoder_depth(config) -> int | None:
    """Decoder layers a config describes: an encoder-decoder model's decoder depth, else `num_hidden_layers`."""
    return getattr(config, decoder_depth_key(config) or "num_hidden_layers", None)


def teacher_forced_logits(model: nn.Module, source: torch.Tensor, decoder_tokens: torch.Tensor) -> torch.Tensor:
    """An encoder-decoder model's logits `[B, T+1, V]` reading `source` `[B, S]` and decoding
    `decoder_start + decoder_tokens` (`[B, T]`) in one parallel pass."""
    start = torch.full((source.shape[0], 1), decoder_start_id(model), dtype=source.dtype, device=source.device)
    return model(input_ids=source, attention_mask=torch.ones_like(source),
                 decoder_input_ids=torch.cat([start, decoder_tokens.to(source.device)], dim=1), use_cache=False).logits


@torch.inference_mode()
def encode(model: nn.Module, prompt: torch.Tensor):
    """The encoder's outputs for `prompt` `[1, P]` (a `BaseModelOutput`, `last_hidden_state` `[1, P, H]`)."""
    return model.get_encoder()(input_ids=prompt, attention_mask=torch.ones_like(prompt))

