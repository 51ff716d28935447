"""Reuse: the slim and the full model share the layers before the slim's first dropped layer."""

import logging
import math

import pytest
import torch
from conftest import PROMPTS
from test_stats import check_accounting

from viasd import DecodePolicy
from viasd.decoding.engine import decode
from viasd.decoding.reuse import SharedPrefix, prefix_length, shared_prefix
from viasd.decoding.slim import RoutingMask, SlimVerifier

N_NEW = 40


def test_prefix_length():
    assert prefix_length((0, 1, 3)) == 2 and prefix_length((1, 2)) == 0 and prefix_length((0, 1, 2)) == 3


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("kw", [dict(tau_accept=1.0, tau_slim=0.3), dict(tau_accept=0.8, tau_slim=0.5, max_lag=3),
                                dict(tau_accept=1.5, tau_slim=0.3, gate=0.05, verify_lagged=False)])
def test_same_greedy_tokens_with_and_without_reuse(model_sets, tokenizer, arch, kw):
    models = model_sets(arch)
    slim = models.slims[0]
    assert shared_prefix(slim) is not None and shared_prefix(slim).k == prefix_length(slim.mask.keep_layers)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        runs = {reuse: models.generate(ids, DecodePolicy(method="viasd", gamma=4, max_new_tokens=N_NEW,
                                                         eos_token_ids=(), reuse=reuse, **kw))
                for reuse in (True, False)}
        shared, plain = runs[True].stats, runs[False].stats
        assert runs[True].token_ids == runs[False].token_ids
        check_accounting(shared)
        for name in ("draft", "slim", "target"):
            assert shared.passes[name] == plain.passes[name]
        k = shared_prefix(slim).k
        L = models.target.config.num_hidden_layers
        # the shared layers run once per position: trunk + rest never exceed the unshared layer count
        assert shared.layer_tokens["trunk"] == k * shared.tokens_processed["trunk"]
        assert shared.layer_tokens["target"] == (L - k) * shared.tokens_processed["target"]
        assert shared.layer_tokens["slim"] == (len(slim.mask.keep_layers) - k) * shared.tokens_processed["slim"]
        assert sum(shared.layer_tokens.values()) < sum(plain.layer_tokens.values())
        assert "trunk" not in plain.passes


def test_tiers_off_uses_no_trunk(model_sets, tokenizer):
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    r = models.generate(ids, DecodePolicy(method="viasd", gamma=4, max_new_tokens=N_NEW, eos_token_ids=(),
                                          tau_accept=math.inf, tau_slim=math.inf, reuse=True))
    assert "trunk" not in r.stats.passes and r.stats.passes["slim"] == 0


def test_layouts_that_cannot_split_fall_back(model_sets, tokenizer, caplog):
    """GPT-2 adds position embeddings to inputs_embeds, so its split changes the logits: reuse is
    refused (logged) and decoding runs unsplit, with the same tokens."""
    models = model_sets("gpt2")
    with caplog.at_level(logging.WARNING, logger="viasd.decoding.reuse"):
        assert SharedPrefix.build(models.target, models.slims[0].mask) is None
    assert "does not take its residual stream back" in caplog.text
    ids = tokenizer(PROMPTS[1])["input_ids"]
    kw = dict(method="viasd", gamma=4, max_new_tokens=N_NEW, eos_token_ids=(), tau_accept=1.0, tau_slim=0.3)
    with_reuse = models.generate(ids, DecodePolicy(reuse=True, **kw))
    assert with_reuse.token_ids == models.generate(ids, DecodePolicy(reuse=False, **kw)).token_ids
    assert "trunk" not in with_reuse.stats.passes


def test_masks_without_a_shared_prefix(model_sets):
    models = model_sets("llama")
    L = models.target.config.num_hidden_layers
    assert shared_prefix(SlimVerifier(models.target, RoutingMask.from_layers([1, 2], L))) is None


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_early_exit_slim_shares_its_whole_pass(model_sets, tokenizer, arch):
    """A prefix-only mask (the truncated slim) is the trunk plus the head: its pass computes no layer of
    its own, an escalation runs only layers k..L-1, and the tokens are those of the unsplit run."""
    models = model_sets(arch)
    L = models.target.config.num_hidden_layers
    slim = SlimVerifier(models.target, RoutingMask.from_layers([0, 1], L))
    split = shared_prefix(slim)
    assert split is not None and split.early_exit and split.k == 2
    kw = dict(method="viasd", gamma=4, max_new_tokens=N_NEW, eos_token_ids=(), tau_accept=1.0, tau_slim=0.3)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        runs = {reuse: decode(ids, DecodePolicy(reuse=reuse, **kw), models.target, models.vocab_size, draft=models.draft,
                              slims=[slim]) for reuse in (True, False)}
        shared, plain = runs[True].stats, runs[False].stats
        assert runs[True].token_ids == runs[False].token_ids
        check_accounting(shared)
        assert shared.passes["slim"] == plain.passes["slim"] and shared.passes["target"] == plain.passes["target"]
        assert shared.layer_tokens["slim"] == 0
        assert shared.layer_tokens["trunk"] == 2 * shared.tokens_processed["trunk"]
        assert shared.layer_tokens["target"] == (L - 2) * shared.tokens_processed["target"]
        assert sum(shared.layer_tokens.values()) < sum(plain.layer_tokens.values())


def test_early_exit_head_must_reproduce_the_slim(model_sets, caplog):
    """A head that is not lm_head(norm(h)) (here: logits scaled after the head) is refused, logged."""
    models = model_sets("llama")
    L = models.target.config.num_hidden_layers
    mask = RoutingMask.from_layers([0, 1], L)
    split = SharedPrefix(models.target, mask.keep_layers, 2)
    assert split.check() is None
    head = split.slim_rest.head
    split.slim_rest.head = torch.nn.Sequential(head, torch.nn.Hardtanh(-1.0, 1.0))
    assert "head is not lm_head(norm(h))" in split.check()
