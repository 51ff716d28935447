"""Dynamic draft length (`draft_stop`): a block's drafting stops after a token its drafter was unsure of. The
lossless methods stay lossless (greedy = `generate(do_sample=False)`, sampled = the target's distribution), the
blocks get shorter where the drafter is unsure, and off (0) drafts `gamma` tokens as before."""

import pytest
from conftest import PROMPTS
from test_distribution import ALPHA, exact_two_token_distribution, p_value, sample_counts
from test_equivalence import hf_greedy
from test_stats import check_accounting

from viasd import DecodePolicy
from viasd.errors import PolicyError

N_NEW = 24
OFF = float("inf")


def run(models, ids, method, stop, gamma=5, **kw):
    policy = DecodePolicy(method=method, gamma=gamma, max_new_tokens=N_NEW, eos_token_ids=(), draft_stop=stop, **kw)
    return models.generate(ids, policy)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_lossless_methods_stay_greedy_ar_with_a_dynamic_draft_length(model_sets, tokenizer, arch):
    models = model_sets(arch)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        reference = hf_greedy(models, ids, N_NEW, None)
        for method, kw in (("sd", {}), ("self_sd", {}), ("cascade_sd", {}),
                           ("viasd", {"tau_accept": OFF, "tau_slim": OFF})):
            fixed, dynamic = run(models, ids, method, 0.0, **kw), run(models, ids, method, 0.9, **kw)
            assert fixed.token_ids == dynamic.token_ids == reference, (method, prompt)
            check_accounting(dynamic.stats)
            if method != "cascade_sd":  # its blocks gather 2 gamma slim-level tokens whatever the draft's length
                assert dynamic.stats.drafted / dynamic.stats.blocks < fixed.stats.drafted / fixed.stats.blocks, method


def test_a_sure_drafter_drafts_the_whole_block(model_sets, tokenizer):
    """A threshold no probability is below (0 < p) changes nothing: every block drafts gamma tokens."""
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    a, b = run(models, ids, "sd", 0.0), run(models, ids, "sd", 1e-12)
    assert a.token_ids == b.token_ids and a.stats.drafted == b.stats.drafted and a.stats.blocks == b.stats.blocks


def test_sampled_sd_with_a_dynamic_draft_length_has_the_targets_distribution(model_sets, tokenizer):
    models = model_sets("llama")
    ids = tokenizer("def parse(self, text):\n")["input_ids"]
    counts = sample_counts(models, ids, "sd", draft_stop=0.6)
    assert p_value(counts, exact_two_token_distribution(models, ids)) > ALPHA


def test_draft_stop_is_a_probability():
    with pytest.raises(PolicyError, match="draft_stop"):
        DecodePolicy(method="sd", draft_stop=1.5)
