"""VIA-SD's tier logic: tiers off is SD, the draft gate, the bonus-token test, lagged-token checks."""

import math

import pytest
from conftest import PROMPTS
from test_stats import MODES, check_accounting

from viasd import DecodePolicy
from viasd.errors import PolicyError

N_NEW = 40


def _run(models, ids, **kw):
    return models.generate(ids, DecodePolicy(gamma=4, max_new_tokens=N_NEW, eos_token_ids=(), seed=5, **kw))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_tiers_off_is_sd_in_tokens_and_passes(model_sets, tokenizer, arch, mode):
    models = model_sets(arch)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        sd = _run(models, ids, method="sd", sampling=MODES[mode])
        off = _run(models, ids, method="viasd", tau_accept=math.inf, tau_slim=math.inf, sampling=MODES[mode])
        assert off.token_ids == sd.token_ids
        assert off.stats.passes["slim"] == 0 and off.stats.tokens_processed["slim"] == 0
        for model in ("draft", "target"):
            assert off.stats.passes[model] == sd.stats.passes[model]
            assert off.stats.tokens_processed[model] == sd.stats.tokens_processed[model]
        assert off.stats.gated_blocks == off.stats.blocks == sd.stats.blocks
        check_accounting(off.stats)


def test_off_tiers_read_from_json_strings():
    policy = DecodePolicy(tau_accept="inf", tau_slim="inf")
    assert policy.tiers_off and policy.tau_accept == math.inf
    assert not DecodePolicy(tau_accept="inf", tau_slim=0.5).tiers_off
    with pytest.raises(PolicyError, match="tau_accept must be a number"):
        DecodePolicy(tau_accept="never")
    with pytest.raises(PolicyError, match="gate must be a probability"):
        DecodePolicy(gate=1.5)


def test_gate_sends_unsure_blocks_to_the_full_model(model_sets, tokenizer):
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    sd = _run(models, ids, method="sd")
    # gate 1: no draft is that sure, so every block is a plain SD block and the slim never runs
    shut = _run(models, ids, method="viasd", tau_accept=0.5, tau_slim=0.3, gate=1.0)
    assert shut.token_ids == sd.token_ids and shut.stats.passes["slim"] == 0
    assert shut.stats.gated_blocks == shut.stats.blocks
    # a gate between the draft's confidences: some blocks gated, the slim runs only in the others
    open_ = _run(models, ids, method="viasd", tau_accept=0.5, tau_slim=0.3, verify_lagged=False)
    mid = _run(models, ids, method="viasd", tau_accept=0.5, tau_slim=0.3, gate=0.02, verify_lagged=False)
    s = mid.stats
    check_accounting(s)
    assert s.passes["slim"] == s.blocks - s.gated_blocks
    assert open_.stats.gated_blocks == 0 and open_.stats.passes["slim"] == open_.stats.blocks


def test_bonus_token_needs_a_confident_slim(model_sets, tokenizer):
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[1])["input_ids"]
    # tier 1 accepts every draft token (ratio >= 0) and tier 2 is off: every block settles without the
    # full model, and no bonus may be emitted because tau_slim = inf fails the confidence test
    r = _run(models, ids, method="viasd", tau_accept=0.0, tau_slim=math.inf, verify_lagged=False)
    s = r.stats
    check_accounting(s)
    assert s.bonus == 0 and s.bonus_withheld == s.blocks and s.passes["target"] == 0
    assert len(r.token_ids) == N_NEW and s.accepted_direct == N_NEW  # every token the draft's, none checked
    # with a confidence bar every slim passes, the bonus comes from the slim
    r2 = _run(models, ids, method="viasd", tau_accept=0.0, tau_slim=0.0, verify_lagged=False)
    assert r2.stats.bonus > 0 and r2.stats.bonus_withheld == 0


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_verify_lagged_makes_checked_tokens_the_targets(model_sets, tokenizer, arch):
    """Greedy, tier 1 accepts everything and a catch-up runs whenever the lag passes 2 tokens: every
    token the full model has checked is its own greedy choice, so all but the unchecked tail (at most
    max_lag + gamma + 1 tokens) equals greedy `ar`; without the check the output drifts."""
    models = model_sets(arch)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        ar = _run(models, ids, method="ar").token_ids
        checked = _run(models, ids, method="viasd", tau_accept=0.0, tau_slim=math.inf, max_lag=2)
        s = checked.stats
        check_accounting(s)
        assert s.catchup_passes > 0 and s.lagged_checked > 0
        tail = 2 + 4 + 1
        assert checked.token_ids[: N_NEW - tail] == ar[: N_NEW - tail]
        assert len(checked.token_ids) == N_NEW
        if s.lagged_rejected:
            assert s.lagged_rolled_back >= s.lagged_rejected
        unchecked = _run(models, ids, method="viasd", tau_accept=0.0, tau_slim=math.inf, max_lag=2,
                         verify_lagged=False)
        assert unchecked.stats.lagged_checked == 0


def test_escalation_rechecks_tier_settled_positions(model_sets, tokenizer):
    """With verify_lagged, an escalated block is verified from its first position, so with tier 2 off
    every emitted token is checked except a tail of tier-1 blocks that never escalated."""
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[2])["input_ids"]
    ar = _run(models, ids, method="ar").token_ids
    r = _run(models, ids, method="viasd", tau_accept=1.2, tau_slim=math.inf, max_lag=1)
    check_accounting(r.stats)
    assert r.token_ids[: N_NEW - 6] == ar[: N_NEW - 6]


@pytest.mark.parametrize("mode", MODES)
def test_per_position_counts(model_sets, tokenizer, mode):
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    s = _run(models, ids, method="viasd", tau_accept=1.0, tau_slim=0.3, sampling=MODES[mode]).stats
    assert len(s.position_reached) == 4
    assert all(0 <= a <= b for a, b in zip(s.position_settled, s.position_reached))
    assert s.position_reached[0] == s.blocks - s.gated_blocks
    # a position is examined only after every earlier one of its block settled
    assert all(s.position_reached[i + 1] <= s.position_settled[i] for i in range(3))
    rates = s.position_pass_rates()
    assert all(r is None or 0 <= r <= 1 for r in rates)
