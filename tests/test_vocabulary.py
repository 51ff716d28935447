"""The shared-vocabulary check compares what decoding relies on — the token -> id map over the ids
both models can emit — not the tokenizers' lengths."""

from __future__ import annotations

import json
import shutil

import pytest
import transformers as tf
from tiny_models import build_tokenizer, config_for

from viasd import DecodePolicy, load_models
from viasd.errors import VocabularyMismatchError


def save_pair(root, tokenizer, target_arch="qwen2", draft_arch="llama"):
    dirs = {}
    for role, arch in (("target", target_arch), ("draft", draft_arch)):
        d = root / role
        tf.AutoModelForCausalLM.from_config(config_for(arch, 2, len(tokenizer), 0)).save_pretrained(d)
        tokenizer.save_pretrained(d)
        dirs[role] = d
    return dirs


def test_an_added_special_token_no_model_can_emit_is_not_a_mismatch(tmp_path):
    tok = build_tokenizer(tmp_path / "tok", vocab_size=300)
    dirs = save_pair(tmp_path, tok)
    # the target's tokenizer gains a special token on load (as Qwen2's tokenizer class does)
    extended = tf.AutoTokenizer.from_pretrained(dirs["target"])
    extended.add_special_tokens({"additional_special_tokens": ["<|extra|>"]})
    extended.save_pretrained(dirs["target"])
    assert len(tf.AutoTokenizer.from_pretrained(dirs["target"])) == len(tok) + 1
    models = load_models(dirs["target"], draft=dirs["draft"], device="cpu")
    assert models.vocab_size == len(tok)
    out = models.generate(models.encode("def f():"), DecodePolicy(method="sd", max_new_tokens=6, eos_token_ids=()))
    assert len(out.token_ids) == 6


def test_a_tokenizer_that_maps_ids_to_other_tokens_makes_a_draft_that_proposes_through_text(tmp_path):
    """Two ids swapped in the draft's tokenizer: another vocabulary, so the draft's proposals are carried
    through text (tests/test_cross_tokenizer.py); the shared-vocabulary path is only for one vocabulary."""
    tok = build_tokenizer(tmp_path / "tok", vocab_size=300)
    dirs = save_pair(tmp_path, tok)
    path = dirs["draft"] / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]  # swap two ordinary tokens' ids in the draft's tokenizer
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(data))
    models = load_models(dirs["target"], draft=dirs["draft"], device="cpu")
    assert models.cross_vocab and not load_models(dirs["target"], draft=dirs["target"], device="cpu").cross_vocab
    policy = DecodePolicy(method="sd", max_new_tokens=6, eos_token_ids=())
    ids = models.encode("def f():")
    assert models.generate(ids, policy).token_ids == models.generate(ids, DecodePolicy(
        method="ar", max_new_tokens=6, eos_token_ids=())).token_ids


def test_regular_tokens_beyond_the_output_layer_are_refused(tmp_path):
    tok = build_tokenizer(tmp_path / "tok", vocab_size=300)
    dirs = save_pair(tmp_path, tok)
    build_tokenizer(tmp_path / "big", vocab_size=400)
    for role in ("target", "draft"):
        shutil.copytree(tmp_path / "big", dirs[role], dirs_exist_ok=True)
    with pytest.raises(VocabularyMismatchError, match="regular tokens but a model's output layer has only 300"):
        load_models(dirs["target"], draft=dirs["draft"], device="cpu")


def test_a_draft_vocabulary_that_extends_the_targets_is_usable(tmp_path):
    """Same ids for every token both know, more tokens in the draft's: decoding cuts the draft's logits
    to the ids both emit, so the pair runs (and greedy sd equals greedy ar)."""
    small = build_tokenizer(tmp_path / "small", vocab_size=280)
    big = build_tokenizer(tmp_path / "big", vocab_size=300)
    assert all(big.get_vocab()[t] == i for t, i in small.get_vocab().items())  # BPE on the same text extends
    dirs = {}
    for role, tok in (("target", small), ("draft", big)):
        d = tmp_path / role
        tf.AutoModelForCausalLM.from_config(config_for("llama", 2, len(tok), 0)).save_pretrained(d)
        tok.save_pretrained(d)
        dirs[role] = d
    models = load_models(dirs["target"], draft=dirs["draft"], device="cpu")
    assert models.vocab_size == len(small)
    ids = models.encode("def f():")
    ar = models.generate(ids, DecodePolicy(method="ar", max_new_tokens=8, eos_token_ids=()))
    sd = models.generate(ids, DecodePolicy(method="sd", gamma=3, max_new_tokens=8, eos_token_ids=()))
    assert sd.token_ids == ar.token_ids
