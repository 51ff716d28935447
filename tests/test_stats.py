"""Statistics add up exactly, caches keep per-block work bounded, and tiers save full passes."""

import pytest
from conftest import PROMPTS

from viasd import DecodePolicy, SamplingConfig
from viasd.decoding.slim import RoutingMask

N_NEW = 40
MODES = {"greedy": SamplingConfig(), "sampled": SamplingConfig(temperature=1.0, top_p=0.9)}


def decoding_widths(s, name: str) -> dict[int, int]:
    """A runner's decoding passes by width (its prefill left out; none for a runner that never ran)."""
    layout = s.layouts().get(name)
    return {int(k.rpartition("/")[2]): n for k, n in s.pass_widths.items()
            if k.rpartition("/")[0] == layout and not k.endswith("/prefill")}


def check_widths(s, gamma: int | None = None, prefilled: bool | None = None):
    """One prefill per runner (`prefilled`: a prompt of more than one decoder token); the passes by width
    are those the method's blocks predict, from the method's own counters (blocks, drafted tokens), which
    the runners do not keep (`sd`: with `gamma`). By default a decoder-only prompt of more than one token
    is prefilled (an encoder-decoder decode starts from its one decoder start token)."""
    if prefilled is None:
        prefilled = s.encoder_time_s == 0 and s.prompt_tokens > 1
    for layout in s.layouts().values():
        assert s.pass_widths.get(f"{layout}/prefill") == (1 if prefilled else None)
    target = decoding_widths(s, "target")
    assert all(w >= 1 for w in target)
    if s.method == "ar":  # the prefill feeds the prompt but its last token; then one token per decoding pass
        assert set(s.pass_widths) <= {"target:4/prefill", "target:4/1", "loop:ar/1"}, s.pass_widths
        assert target == {1: s.new_tokens + s.truncated}
    if s.method == "sd" and gamma is not None:  # one verification per block over the last committed token and
        # the block's drafts (the first block's last committed token is the prompt's last)
        assert sum(target.values()) == s.blocks
        assert sum(w * n for w, n in target.items()) == s.drafted + s.blocks
        assert max(target) <= gamma + 1
    assert s.prefill_time_s <= s.wall_time_s and s.decode_time_s == pytest.approx(
        s.wall_time_s - s.prefill_time_s - s.encoder_time_s)
    # the loop's work: one entry per call of the method's block, its seconds what the passes leave of the wall time
    loop = f"loop:{s.method}/1"
    assert s.pass_widths[loop] >= s.blocks and 0 <= s.pass_width_s[loop] <= s.wall_time_s
    assert s.pass_width_s[loop] + sum(s.time_s.values()) + s.encoder_time_s == pytest.approx(s.wall_time_s)


def check_accounting(s, gamma: int | None = None):
    check_widths(s, gamma)
    if s.method == "ar":  # one target pass per token after the prefill, nothing drafted
        assert s.passes["target"] == s.new_tokens + s.truncated and s.drafted == 0
        return
    out = (s.accepted_direct + s.accepted_slim + s.accepted_full + s.regenerated_slim + s.rejected_full + s.bonus
           + s.lagged_rejected - s.lagged_rolled_back)
    assert s.new_tokens == out - s.truncated
    if s.method == "cascade_sd":
        assert s.drafted == s.slim_accepted + s.rejected_slim + s.discarded
        assert s.slim_accepted + s.slim_generated == s.accepted_full + s.rejected_full + s.discarded_slim_level
        assert s.cascade_draft_kept <= s.accepted_full
    else:
        kept = s.accepted_direct + s.accepted_slim + s.accepted_full
        assert s.drafted == kept + s.regenerated_slim + s.rejected_full + s.discarded
        assert s.draft_kept == kept
    assert sum(s.direct_by_level) == s.accepted_direct
    assert sum(s.slim_accept_by_level) == s.accepted_slim
    assert sum(s.regen_by_level) == s.regenerated_slim
    assert 0 <= s.verified <= s.drafted + (s.slim_generated if s.method == "cascade_sd" else 0)
    if s.blocks:
        assert 0 <= s.rejection_rate <= 1 and 0 <= s.acceptance_rate <= 1
    # caches: each block feeds each model its own new positions only, never the whole prefix again
    fed_limit = s.prompt_tokens + s.drafted + s.slim_generated + 2 * s.blocks + s.new_tokens + s.lagged_rolled_back
    for name, fed in s.tokens_processed.items():
        assert fed <= fed_limit, (name, fed, fed_limit)
    # one full pass per escalated block: a max_lag catch-up is folded into its block's full pass
    assert s.passes["target"] == s.escalated_blocks
    assert s.catchup_passes <= s.gated_blocks


VARIANTS = [
    ("ar", {}),
    ("sd", {}),
    ("cascade_sd", {}),
    ("cascade_sd", dict(gamma_slim=3)),
    ("spec_cascade", dict(rule="opt", alpha=0.3)),
    ("spec_cascade", dict(rule="token_v2", alpha=0.3)),
    ("viasd", dict(tau_accept=1.0, tau_slim=0.3)),
    ("viasd", dict(tau_accept=0.5, tau_slim=0.2, score="ratio_argmax", confidence="margin", max_lag=6)),
    ("viasd", dict(tau_accept=-0.5, tau_slim=-1.0, score="neg_entropy", confidence="neg_entropy")),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("method,kw", VARIANTS)
def test_statistics_add_up(model_sets, tokenizer, method, kw, mode):
    models = model_sets("llama")
    for prompt in PROMPTS[:2]:
        ids = tokenizer(prompt)["input_ids"]
        result = models.generate(ids, DecodePolicy(method=method, gamma=4, max_new_tokens=N_NEW, eos_token_ids=(),
                                                   sampling=MODES[mode], seed=3, **kw))
        assert len(result.token_ids) == result.stats.new_tokens == N_NEW
        check_accounting(result.stats, gamma=4)


def test_tiers_cut_full_model_passes(model_sets, tokenizer):
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[0])["input_ids"]

    def stats(**kw):
        return models.generate(ids, DecodePolicy(method="viasd", gamma=4, max_new_tokens=N_NEW, eos_token_ids=(),
                                                 **kw)).stats

    off = stats(tau_accept=float("inf"), tau_slim=float("inf"))
    assert off.escalated_blocks == off.blocks == off.passes["target"]
    on = stats(tau_accept=1.0, tau_slim=0.3)
    assert on.accepted_direct + on.accepted_slim + on.regenerated_slim > 0
    settled_by_slim = on.blocks - on.escalated_blocks
    assert settled_by_slim > 0
    assert on.passes["target"] == on.escalated_blocks
    assert on.passes["target"] < off.passes["target"]
    everything = stats(tau_accept=0.0, tau_slim=float("inf"))  # every draft token passes tier 1
    assert everything.passes["target"] == 0
    assert everything.accepted_direct == everything.drafted


def test_max_lag_bounds_the_full_models_lag(model_sets, tokenizer):
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    result = models.generate(ids, DecodePolicy(method="viasd", gamma=4, max_new_tokens=N_NEW, eos_token_ids=(),
                                               tau_accept=0.0, tau_slim=float("inf"), max_lag=10))
    s = result.stats
    assert s.catchup_passes >= (N_NEW - 10) // 15
    assert s.passes["target"] == s.catchup_passes
    check_accounting(s)


def test_n_tier_cascade_uses_larger_levels_lazily(model_sets, tokenizer):
    from viasd.decoding.engine import decode

    models = model_sets("llama")
    slims = [models.slims[0], type(models.slims[0])(models.target, RoutingMask.from_layers([0, 1, 2], 4))]
    ids = tokenizer(PROMPTS[0])["input_ids"]
    policy = DecodePolicy(method="viasd", gamma=4, max_new_tokens=N_NEW, eos_token_ids=(),
                          tau_accept=(1.5, 1.0), tau_slim=(0.6, 0.3), verify_lagged=False)
    s = decode(ids, policy, models.target, models.vocab_size, draft=models.draft, slims=slims).stats
    check_accounting(s)
    assert len(s.direct_by_level) == 2
    assert s.passes["slim0"] == s.blocks  # the smallest runs every block
    assert s.passes["slim1"] < s.blocks  # the larger one only when a position reaches it
    assert s.direct_by_level[1] + s.slim_accept_by_level[1] + s.regen_by_level[1] > 0
    off = DecodePolicy(method="viasd", gamma=4, max_new_tokens=N_NEW, eos_token_ids=(),
                       tau_accept=float("inf"), tau_slim=float("inf"))
    sd = models.generate(ids, DecodePolicy(method="sd", gamma=4, max_new_tokens=N_NEW, eos_token_ids=()))
    assert decode(ids, off, models.target, models.vocab_size, draft=models.draft, slims=slims).token_ids == sd.token_ids


def test_stats_json_and_summary(model_sets, tokenizer):
    import json

    models = model_sets("llama")
    result = models.generate(PROMPTS[0], DecodePolicy(method="viasd", gamma=3, max_new_tokens=10))
    data = json.loads(json.dumps(result.stats.as_dict()))
    for key in ("rejection_rate", "acceptance_rate", "mean_accepted_length", "tokens_per_second", "passes",
                "tokens_processed", "time_s", "block_escalation_rate", "slim_regen_rate"):
        assert key in data
    assert set(data["time_s"]) == {"draft", "slim", "target"}
    assert set(data["layer_tokens"]) == set(data["time_s"])
    assert "tokens" in result.stats.summary()


def test_independent_intermediate_model(tokenizer, pair_dirs, tmp_path):
    """The independent ablation: a separately trained model in the slim verifier's place."""
    from tiny_models import build_tokenizer

    from viasd import load_models
    from viasd.decoding.engine import decode
    from viasd.decoding.intermediate import IndependentVerifier
    from viasd.errors import VocabularyMismatchError

    target_dir, draft_dir = pair_dirs("llama")
    other_arch, _ = pair_dirs("gpt2")  # any causal LM with the same tokenizer will do
    loaded = load_models(target_dir, draft=draft_dir, independent=other_arch, device="cpu")
    assert isinstance(loaded.slims[-1], IndependentVerifier)
    ids = tokenizer(PROMPTS[0])["input_ids"]
    sd = loaded.generate(ids, DecodePolicy(method="sd", gamma=4, max_new_tokens=N_NEW, eos_token_ids=()))
    off = DecodePolicy(method="viasd", gamma=4, max_new_tokens=N_NEW, eos_token_ids=(),
                       tau_accept=float("inf"), tau_slim=float("inf"))
    assert loaded.generate(ids, off).token_ids == sd.token_ids
    on = loaded.generate(ids, DecodePolicy(method="viasd", gamma=4, max_new_tokens=N_NEW, eos_token_ids=(),
                                           tau_accept=1.0, tau_slim=0.3))
    check_accounting(on.stats)
    cascade = decode(ids, DecodePolicy(method="cascade_sd", gamma=3, max_new_tokens=N_NEW, eos_token_ids=()),
                     loaded.target, loaded.vocab_size, draft=loaded.draft, slims=[loaded.slims[-1]])
    assert cascade.token_ids == sd.token_ids
    with pytest.raises(VocabularyMismatchError):
        loaded.add_independent(loaded.draft, build_tokenizer(tmp_path, vocab_size=300))
