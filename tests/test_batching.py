"""Batched decoding (`viasd.decoding.batching`): every row decodes exactly as its prompt alone.

Greedy rows equal `generate(do_sample=False)` on their prompt alone for every method and the main layouts,
with prompts of different lengths, more prompts than slots (continuous batching), rows ending early at an
EOS inside a block and at stop strings; batch 1 gives the single decode's tokens and pass counts; sampled
rows equal their seeded single decodes and follow the target's distribution (chi-square, as
tests/test_distribution.py); what cannot batch says so in one line."""

import pytest
import torch
from conftest import PROMPTS
from test_distribution import ALPHA, WARP, exact_two_token_distribution, p_value
from test_equivalence import N_NEW, _eos_inside, hf_greedy

from viasd import DecodePolicy, SamplingConfig
from viasd.decoding.policy import LOSSLESS
from viasd.decoding.ragged_cache import Feed
from viasd.errors import PolicyError, PromptError

METHODS = ["ar", "sd", "self_sd", "cascade_sd", "spec_cascade", "viasd"]
BATCH_PROMPTS = [*PROMPTS, "x", "class Parser:\n    def __init__(self):\n        self.items = []\n"]


def _policy(method, **kw):
    return DecodePolicy(method=method, gamma=3, max_new_tokens=N_NEW, **kw)


def _alone(models, prompts, policy):
    from dataclasses import replace

    return [models.generate(p, replace(policy, seed=policy.seed + i)) for i, p in enumerate(prompts)]


def test_feed_writes_each_row_at_its_own_offset():
    """Right-aligned columns: a row's tokens at its own positions, its padding past its end; each column sees
    its row's prefix and itself."""
    feed = Feed.build([3, 0, 5], [2, 3, 0], torch.float32, "cpu")
    assert feed.write.tolist() == [[5, 3, 4], [0, 1, 2], [5, 6, 7]]
    assert feed.span == 8
    visible = (feed.mask[:, 0] == 0).int()
    assert visible[0, 1].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]  # row 0's first token, at position 3
    assert visible[1, 0].tolist() == [1, 0, 0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "gpt_neox"])
def test_greedy_rows_equal_transformers_alone(model_sets, tokenizer, arch):
    models = model_sets(arch)
    ids = [tokenizer(p)["input_ids"] for p in BATCH_PROMPTS]
    reference = [hf_greedy(models, i, N_NEW, None) for i in ids]
    for method in METHODS:
        # the lossy methods (spec_cascade, viasd with its tiers) against their own decodes alone
        alone = reference if method in LOSSLESS else [r.token_ids for r in _alone(models, ids, _policy(method))]
        for batch_size in (2, len(ids)):  # 2 slots for 5 prompts: rows join as others end
            out = models.generate(ids, _policy(method), batch_size=batch_size)
            assert [r.token_ids for r in out] == alone, (method, batch_size)


def test_batch_of_one_is_the_single_decode_pass_for_pass(model_sets, tokenizer):
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    for method in METHODS:
        alone = models.generate(ids, _policy(method))
        (row,), stats = models.generate_batch([ids], _policy(method))
        assert row.token_ids == alone.token_ids
        assert row.stats.passes == alone.stats.passes and row.stats.tokens_processed == alone.stats.tokens_processed
        assert stats.passes.get("target") == alone.stats.passes["target"] + (1 if len(ids) > 1 else 0)  # + prefill


def test_rows_share_passes(model_sets, tokenizer):
    """Four rows decoding together take far fewer full-model passes than the four decodes alone."""
    models = model_sets("llama")
    ids = [tokenizer(p)["input_ids"] for p in BATCH_PROMPTS[:4]]
    results, stats = models.generate_batch(ids, _policy("sd"))
    alone = sum(r.stats.passes["target"] for r in results)
    assert stats.passes["target"] < alone / 2
    assert stats.new_tokens == sum(len(r.token_ids) for r in results) == 4 * N_NEW


def test_rows_ending_early_at_eos_and_stop_strings(model_sets, tokenizer):
    models = model_sets("llama")
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    eos = _eos_inside(models, ids[0])
    reference = [hf_greedy(models, i, N_NEW, eos) for i in ids]
    assert len(reference[0]) < N_NEW  # the first row ends inside a block, the others may run on
    for method in ("ar", "sd", "viasd"):
        policy = _policy(method, eos_token_ids=(eos,))
        alone = reference if method in LOSSLESS else [r.token_ids for r in _alone(models, ids, policy)]
        assert [r.token_ids for r in models.generate(ids, policy, batch_size=2)] == alone, method
    # a stop string: each row cut where its own text first holds it, as alone
    text = tokenizer.decode(reference[1][:6])
    stop = text[len(text) // 2 :][:2] or text[-1]
    policy = _policy("sd", stop_strings=(stop,))
    assert [r.token_ids for r in models.generate(ids, policy)] == [r.token_ids for r in _alone(models, ids, policy)]


def test_sampled_rows_equal_their_seeded_single_decodes(model_sets, tokenizer):
    models = model_sets("qwen2")
    ids = [tokenizer(p)["input_ids"] for p in BATCH_PROMPTS]
    for method in METHODS:
        policy = _policy(method, sampling=SamplingConfig(temperature=1.0, top_p=0.9), seed=7)
        out = models.generate(ids, policy, batch_size=3)
        assert [r.token_ids for r in out] == [r.token_ids for r in _alone(models, ids, policy)], method


@pytest.mark.parametrize("method", ["sd", "viasd"])
def test_sampled_rows_follow_the_target_distribution(model_sets, tokenizer, method):
    """1500 rows of one prompt in batches of 50, each its own seed: their first two tokens fit the warped
    target's exact two-token distribution (viasd with its tiers off: the lossless path under batching)."""
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    dist = exact_two_token_distribution(models, ids)
    extra = {"tau_accept": float("inf"), "tau_slim": float("inf")} if method == "viasd" else {}
    policy = DecodePolicy(method=method, gamma=2, max_new_tokens=2, sampling=WARP, eos_token_ids=(), **extra)
    counts = {}
    results, _ = models.generate_batch([ids] * 1500, policy, batch_size=50)
    for r in results:
        key = tuple(r.token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
    assert p_value(counts, dist) > ALPHA


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_rows_drafted_by_the_feature_drafter_decode_as_alone(model_sets, tokenizer, arch):
    """The feature drafter in a batch: its body's passes shared, its inputs and head per row, each row's trunk
    features cut from the batched trunk pass. Greedy `sd` rows equal transformers' greedy decode alone, tiered
    `viasd` rows and sampled rows their own decodes alone; the capture hooks leave."""
    from test_feature_drafter import drafter_for

    from viasd import RoutingMask, SlimVerifier, decode
    from viasd.decoding.engine import decode_batch

    models = model_sets(arch)
    drafter = drafter_for(models)
    slim = SlimVerifier(models.target, RoutingMask.from_layers([0, 1], models.target.config.num_hidden_layers))
    ids = [tokenizer(p)["input_ids"] for p in BATCH_PROMPTS]
    reference = [hf_greedy(models, i, N_NEW, None) for i in ids]
    tiers = {"reuse": True, "score": "ratio_argmax", "verify_lagged": True}
    for policy, lossless in [(_policy("sd", eos_token_ids=()), True),
                             (_policy("viasd", eos_token_ids=(), tau_accept=0.5, tau_slim=0.5, **tiers), False),
                             (_policy("sd", eos_token_ids=(), sampling=SamplingConfig(temperature=1.0), seed=3), False)]:
        slims = [slim] if policy.method == "viasd" else []
        from dataclasses import replace

        alone = reference if lossless else [
            decode(p, replace(policy, seed=policy.seed + i), models.target, models.vocab_size, draft=drafter,
                   slims=slims).token_ids for i, p in enumerate(ids)]
        for batch_size in (2, len(ids)):
            rows, stats = decode_batch(ids, policy, models.target, models.vocab_size, draft=drafter, slims=slims,
                                       batch_size=batch_size)
            assert [r.token_ids for r in rows] == alone, (policy.method, policy.tau_accept, batch_size)
            assert stats.passes["feature"] < sum(r.stats.passes["feature"] for r in rows)  # shared passes
    stack = models.target.model.layers
    assert not [h for layer in stack for h in layer._forward_hooks.values()
                if getattr(h, "__qualname__", "").startswith("TrunkFeatures")]


def test_what_cannot_batch_says_so(model_sets, tokenizer):
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS[:2]]
    with pytest.raises(PolicyError, match="sliding-window"):
        model_sets("gemma2").generate(ids, _policy("sd"))
    with pytest.raises(PromptError, match="at least one prompt"):
        from viasd.decoding.engine import decode_batch

        models = model_sets("llama")
        decode_batch([], _policy("ar"), models.target, models.vocab_size)
    with pytest.raises(PolicyError, match="batch_size"):
        model_sets("llama").generate(ids, _policy("ar"), batch_size=0)
