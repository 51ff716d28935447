"""Model configs of the default family, from `params.yaml` architecture fields."""

from __future__ import annotations

from ..config import ModelArch


def llama_config(arch: ModelArch, vocab_size: int, context: int, eos_token_id: int):
    """A `LlamaConfig` honouring every architecture field of `arch` (layers, width, heads, ...)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=arch.hidden,
        intermediate_size=arch.intermediate,
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads,
        num_key_value_heads=arch.kv_heads or arch.heads,
        max_position_embeddings=context,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        initializer_range=0.02,
    )


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
