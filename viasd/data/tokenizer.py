"""A byte-level BPE tokenizer trained on the train split, saved as a `transformers` tokenizer.

Byte-level BPE with no normaliser round-trips any text exactly: `decode(encode(x)) == x`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

EOS = "<|endoftext|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int, out_dir: Path):
    """Train, save to `out_dir` (tokenizer.json + config), and return the fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS,
                                   model_max_length=1_000_000, clean_up_tokenization_spaces=False)
    fast.save_pretrained(out_dir)
    return fast


def load_tokenizer(path: Path):
    """As users load it: `AutoTokenizer.from_pretrained(dir)`."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
