"""The feature drafter (EAGLE-3-style, on the target's shared trunk): greedy speculative output with it equals
`generate(do_sample=False)` for `sd` and for `viasd` on top of it; sampled output has the target's distribution;
the runner drafts exactly what training scores (true trunk features at the block's start, then its own outputs);
training lowers the loss and the saved drafter loads to the same logits; misuse gets one clear error."""

import numpy as np
import pytest
import torch
from conftest import PROMPTS
from test_distribution import ALPHA, WARP, N, exact_two_token_distribution, p_value
from test_equivalence import hf_greedy
from test_stats import check_accounting
from tiny_models import TEXT

from viasd import DecodePolicy, RoutingMask, SlimVerifier, decode
from viasd.decoding.engine import DecodeSession
from viasd.decoding.feature_drafter import FeatureDrafter, TrunkFeatures, feature_layers, load_feature_drafter
from viasd.errors import PolicyError
from viasd.training.feature_drafter import drafter_loss, target_continuations, target_pass, train_feature_drafter

N_NEW = 24


def drafter_for(models, trunk_layers=2, seed=0):
    torch.manual_seed(seed)
    return FeatureDrafter(models.target, trunk_layers).eval()


def test_feature_layers_are_low_middle_high_of_the_trunk():
    assert feature_layers(6) == (1, 3, 5) and feature_layers(12) == (3, 7, 11)
    assert feature_layers(2) == (0, 1) and feature_layers(1) == (0,)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_sd_and_viasd_with_a_feature_drafter_equal_transformers(model_sets, tokenizer, arch):
    """`sd` splits the full model at the drafter's trunk (the verification runs layers k..L-1 after it); `viasd`
    shares the slim's trunk (a prefix mask: the early exit) with the drafter and the full model. Every token is
    greedy `ar`'s, whatever the drafter proposes."""
    models = model_sets(arch)
    drafter = drafter_for(models)
    L = models.target.config.num_hidden_layers
    slim = SlimVerifier(models.target, RoutingMask.from_layers([0, 1], L))
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        reference = hf_greedy(models, ids, N_NEW, None)
        for gamma in (1, 3, 5):
            sd = decode(ids, DecodePolicy(method="sd", gamma=gamma, max_new_tokens=N_NEW, eos_token_ids=()),
                        models.target, models.vocab_size, draft=drafter)
            assert sd.token_ids == reference, (prompt, gamma)
            check_accounting(sd.stats)
            assert sd.stats.passes["trunk"] > 0 and sd.stats.layer_tokens["target"] == \
                (L - 2) * sd.stats.tokens_processed["target"]
            for taus in ((0.5, 0.5), (float("inf"), float("inf"))):  # tiers on (lossy: accounting), off (= sd)
                policy = DecodePolicy(method="viasd", gamma=gamma, max_new_tokens=N_NEW, eos_token_ids=(), reuse=True,
                                      tau_accept=taus[0], tau_slim=taus[1], score="ratio_argmax", verify_lagged=True)
                out = decode(ids, policy, models.target, models.vocab_size, draft=drafter, slims=[slim])
                check_accounting(out.stats)
                if policy.tiers_off:
                    assert out.token_ids == reference
    # the capture hooks leave with the decode
    stack = models.target.model.layers
    assert all(not any(getattr(h, "__qualname__", "").startswith("TrunkFeatures") for h in layer._forward_hooks.values())
               for layer in stack)


def test_the_runner_drafts_what_training_scores(model_sets, tokenizer):
    """After the prompt, the first draft token comes from the trunk's true features (one parallel pass), the next
    ones from the drafter's own outputs: the logits of `draft_tokens` equal the training path's (`drafter_loss`'s
    depth 1, then its training-time-test steps) on the same tokens."""
    models = model_sets("llama")
    drafter = drafter_for(models, seed=3)
    ids = tokenizer(PROMPTS[0])["input_ids"]
    n = len(ids)
    session = DecodeSession(ids, DecodePolicy(method="sd", gamma=4, max_new_tokens=8, eos_token_ids=()),
                            models.target, models.vocab_size, draft=drafter)
    session.prefill()
    x, logits = session.draft_tokens(4)
    session.trunk.close()
    seq = torch.tensor([ids + x.tolist()])
    capture = TrunkFeatures(models.target, drafter.layers)
    feats, _ = target_pass(models.target, capture, seq)
    capture.remove()
    with torch.no_grad():
        cache = drafter.new_cache()
        first, g = drafter(feats[:, : n - 1], seq[:, 1:n], cache=cache)
        rows = [first[0, -1]]
        own = g[:, -1:]
        for j in range(1, 4):
            t = n + j - 2
            out, own = drafter(own, seq[:, t + 1 : t + 2], cache=cache, own=True)
            rows.append(out[0, -1])
    expected = torch.stack(rows)[:, : models.vocab_size].float()
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


def test_sampled_sd_with_a_feature_drafter_has_the_targets_distribution(model_sets, tokenizer):
    models = model_sets("llama")
    drafter = drafter_for(models, seed=1)
    ids = tokenizer("def parse(self, text):\n")["input_ids"]
    dist = exact_two_token_distribution(models, ids)
    counts = {}
    for seed in range(N):
        policy = DecodePolicy(method="sd", gamma=2, max_new_tokens=2, sampling=WARP, seed=seed, eos_token_ids=())
        key = tuple(decode(ids, policy, models.target, models.vocab_size, draft=drafter).token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
    assert p_value(counts, dist) > ALPHA


def test_training_lowers_the_loss_and_the_saved_drafter_loads_alike(model_sets, tokenizer, tmp_path):
    models = model_sets("llama")
    stream = np.asarray(tokenizer(TEXT[:20000])["input_ids"], dtype=np.int64)
    settings = dict(lr=3e-3, ttt_steps=3, batch_size=2, seq_len=48, weight_decay=0.0, grad_clip=1.0,
                    warmup_fraction=0.05, precision="float32", seed=0, eval_windows=2, progress=False)
    windows = target_continuations(models.target, stream, 6, 12, 49, seed=0, batch=4, progress=False)
    assert windows.shape == (6, 49)
    assert windows[0, 12:].tolist() == hf_greedy(models, windows[0, :12].tolist(), 37, None)  # the target's own text
    drafter, report = train_feature_drafter(models.target, stream, stream, 2, train_tokens=60 * 2 * 48,
                                            continuations=windows, **settings)
    assert report["steps"] == 60 and len(report["loss_curve"]) == 60 and report["data"] == "target continuations"
    assert np.mean(report["loss_curve"][-10:]) < np.mean(report["loss_curve"][:10])
    assert len(report["test_agreement_by_depth"]) == 3 and all(0 <= a <= 1 for a in report["test_agreement_by_depth"])
    assert all(p.grad is None for p in models.target.parameters())  # the target is frozen, and left as it was
    drafter.save(tmp_path / "fd", {"note": "test"})
    loaded = load_feature_drafter(tmp_path / "fd", models.target)
    assert loaded.layers == drafter.layers and loaded.trunk_layers == 2
    ids = torch.tensor([tokenizer(PROMPTS[1])["input_ids"]])
    capture = TrunkFeatures(models.target, drafter.layers)
    feats, logp = target_pass(models.target, capture, ids)
    capture.remove()
    with torch.no_grad():
        a, _ = drafter(feats[:, :-1], ids[:, 1:])
        b, _ = loaded(feats[:, :-1], ids[:, 1:])
        loss, depths = drafter_loss(drafter, feats, logp, ids, 2, 2)
    torch.testing.assert_close(a, b)
    assert len(depths) == 2 and torch.isfinite(loss)


def test_a_feature_drafter_needs_the_trunk_it_reads(model_sets, tokenizer):
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    drafter = drafter_for(models, trunk_layers=2)
    L = models.target.config.num_hidden_layers
    short = SlimVerifier(models.target, RoutingMask.from_layers([0, 2], L))  # shares layer 0 only
    policy = DecodePolicy(method="viasd", gamma=2, max_new_tokens=4, eos_token_ids=(), reuse=True, tau_accept=0.5,
                          tau_slim=0.5)
    with pytest.raises(PolicyError, match="shares only layers 0..0"):
        decode(ids, policy, models.target, models.vocab_size, draft=drafter, slims=[short])
    with pytest.raises(PolicyError, match="unknown drafter"):
        DecodePolicy(drafter="medusa")
    with pytest.raises(PolicyError, match="needs a feature drafter"):
        models.generate(ids, DecodePolicy(method="sd", gamma=2, max_new_tokens=4, eos_token_ids=(), drafter="feature"))
