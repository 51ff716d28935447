"""Randomly initialised tiny models of several architectures, saved to disk so that they load through
the same path as a user's (`load_models`), plus a small byte-level BPE tokenizer they share."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import torch
import transformers as tf

HIDDEN = 64
TEXT = (Path(inspect.getfile(inspect)).read_text()[:60000])  # the stdlib's own source, always present


def build_tokenizer(path: Path, vocab_size: int = 256):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TEXT], trainer)
    fast = tf.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    fast.save_pretrained(path)
    return fast


def config_for(arch: str, layers: int, vocab: int, eos: int):
    common = dict(vocab_size=vocab, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    dense = dict(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=layers, num_attention_heads=4,
                 max_position_embeddings=512, tie_word_embeddings=False, **common)
    if arch == "llama":
        return tf.LlamaConfig(num_key_value_heads=2, **dense)
    if arch == "mistral":
        return tf.MistralConfig(num_key_value_heads=2, sliding_window=None, **dense)
    if arch == "qwen2":
        return tf.Qwen2Config(num_key_value_heads=2, **dense)
    if arch == "qwen3":
        return tf.Qwen3Config(num_key_value_heads=2, head_dim=16, **dense)
    if arch == "gemma2":
        return tf.Gemma2Config(num_key_value_heads=2, head_dim=16, sliding_window=8, **dense)
    if arch == "phi3":
        return tf.Phi3Config(num_key_value_heads=2, **dense)
    if arch == "gpt2":
        return tf.GPT2Config(n_embd=HIDDEN, n_layer=layers, n_head=4, n_positions=512, **common)
    if arch == "gpt_neox":
        return tf.GPTNeoXConfig(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=layers,
                                num_attention_heads=4, max_position_embeddings=512, tie_word_embeddings=False, **common)
    if arch == "opt":
        return tf.OPTConfig(hidden_size=HIDDEN, ffn_dim=2 * HIDDEN, num_hidden_layers=layers, num_attention_heads=4,
                            word_embed_proj_dim=HIDDEN, max_position_embeddings=512, **common)
    raise ValueError(arch)


ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "phi3", "gpt2", "gpt_neox", "opt")


def build_model(path: Path, arch: str, layers: int, seed: int, tokenizer, scale: float = 1.0):
    """Save a random `arch` model; `scale` sharpens its output distribution (larger = peakier)."""
    torch.manual_seed(seed)
    config = config_for(arch, layers, len(tokenizer), tokenizer.eos_token_id)
    model = tf.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        head = model.get_output_embeddings()
        head.weight.mul_(scale)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_pair(root: Path, arch: str, tokenizer, layers: int = 4, seed: int = 0, scale: float = 25.0,
               noise: float = 0.3, damping: float = 0.5) -> tuple[Path, Path]:
    """A random target and a draft that partly agrees with it: the target's blocks after the first
    are damped (weights times `damping`) so that they perturb rather than replace its first block's
    output, and the draft is the target's embeddings, first block, final norm and head with noise
    added (a noisy early-exit model). Acceptance in the tests is then neither 0 nor 1, and every
    branch of every acceptance rule is exercised."""
    target_dir = build_model(root / f"{arch}-target", arch, layers, seed, tokenizer, scale)
    target = tf.AutoModelForCausalLM.from_pretrained(target_dir)
    with torch.no_grad():
        for name, param in target.named_parameters():
            index = re.search(r"\.(\d+)\.", name)
            if index and int(index.group(1)) >= 1 and param.dim() == 2:
                param.mul_(damping)
    target.save_pretrained(target_dir)
    torch.manual_seed(seed + 1)
    config = config_for(arch, 1, len(tokenizer), tokenizer.eos_token_id)
    draft = tf.AutoModelForCausalLM.from_config(config)
    state = {k: v for k, v in target.state_dict().items() if k in draft.state_dict()}
    draft.load_state_dict(state, strict=False)
    with torch.no_grad():
        for name, param in draft.named_parameters():
            if param.dim() == 2 and "emb" not in name and "wte" not in name and "wpe" not in name:
                param.add_(noise * param.std() * torch.randn_like(param))
    draft_dir = root / f"{arch}-draft"
    draft.save_pretrained(draft_dir)
    tokenizer.save_pretrained(draft_dir)
    return target_dir, draft_dir
