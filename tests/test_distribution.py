"""Sampled `sd` and `cascade_sd` have exactly the target's distribution.

The first two new tokens of `N` seeded decodes are counted and compared, by a chi-square test, with
the exact distribution of the warped target (enumerated from the target's own logits). The same
test must reject a deliberately wrong acceptance rule, which shows it has power at this sample size.
Significance 1e-3 with fixed seeds: deterministic, and a correct sampler would fail it for only 0.1 %
of seed sets. Power, measured on this pair: at N = 2500 the two wrong rules below gave p = 7e-153 and
p = 0, the correct `sd` and `cascade_sd` p = 0.23 and 0.52; N = 1500 keeps a wide margin.
"""

import pytest
import torch
from scipy import stats as scipy_stats

from viasd import DecodePolicy, SamplingConfig
from viasd.decoding.acceptance import leading_true
from viasd.decoding.engine import DecodeSession
from viasd.decoding.sampling import Sampler

N = 1500
ALPHA = 1e-3
WARP = SamplingConfig(temperature=1.0, top_k=5)
PROMPT = "def parse(self, text):\n"


@pytest.fixture(scope="module")
def setup(model_sets, tokenizer):
    models = model_sets("llama")
    ids = tokenizer(PROMPT)["input_ids"]
    return models, ids, exact_two_token_distribution(models, ids)


def exact_two_token_distribution(models, ids):
    """{(t1, t2): probability} under the warped target, by enumeration."""
    device = models.target.device
    warp = Sampler(WARP, device, 0).probs
    with torch.inference_mode():
        logits = models.target(torch.tensor([ids], device=device)).logits[0, -1, : models.vocab_size].float()
        first = warp(logits)
        dist = {}
        for t1 in torch.nonzero(first).flatten().tolist():
            nxt = models.target(torch.tensor([ids + [t1]], device=device)).logits[0, -1, : models.vocab_size].float()
            second = warp(nxt)
            for t2 in torch.nonzero(second).flatten().tolist():
                dist[(t1, t2)] = float(first[t1] * second[t2])
    return dist


def p_value(counts: dict, dist: dict) -> float:
    """Chi-square goodness of fit; cells with expected count < 5 are pooled into one."""
    n = sum(counts.values())
    observed, expected, pool_o, pool_e = [], [], 0, 0.0
    for cell, prob in dist.items():
        if prob * n >= 5:
            observed.append(counts.get(cell, 0))
            expected.append(prob * n)
        else:
            pool_o += counts.get(cell, 0)
            pool_e += prob * n
    pool_o += sum(c for cell, c in counts.items() if cell not in dist)  # impossible outcomes
    observed.append(pool_o)
    expected.append(max(pool_e, 1e-9))
    total = sum(expected)
    expected = [e * n / total for e in expected]
    return float(scipy_stats.chisquare(observed, expected).pvalue)


def sample_counts(models, ids, method, block=None, **kw):
    from viasd.decoding.engine import decode

    counts = {}
    for seed in range(N):
        policy = DecodePolicy(method=method, gamma=2, max_new_tokens=2, sampling=WARP, seed=seed,
                              eos_token_ids=(), **kw)
        if block is None:
            tokens = decode(ids, policy, models.target, models.vocab_size, draft=models.draft,
                            slims=models.slims).token_ids
        else:
            session = DecodeSession(ids, policy, models.target, models.vocab_size, draft=models.draft)
            tokens = session.run(block).token_ids
        key = tuple(tokens[:2])
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_sampled_ar_matches_target(setup):
    models, ids, dist = setup
    assert p_value(sample_counts(models, ids, "ar"), dist) > ALPHA


def test_sampled_sd_matches_target(setup):
    models, ids, dist = setup
    counts = sample_counts(models, ids, "sd")
    assert p_value(counts, dist) > ALPHA


def test_sampled_cascade_sd_matches_target(setup):
    models, ids, dist = setup
    counts = sample_counts(models, ids, "cascade_sd", gamma_slim=2)
    assert p_value(counts, dist) > ALPHA


def _sd_resampling_from_q(s, state):
    """A classic bug: after a rejection, draw the replacement from q instead of norm(max(0, q - p))."""
    g = s.block_size()
    x, p_logits = s.draft_tokens(g)
    p = s.sampler.probs(p_logits)
    q = s.sampler.probs(s.target.forward(s.ids, s.length + g, g + 1))
    px, qx = p.gather(-1, x[:, None])[:, 0], q.gather(-1, x[:, None])[:, 0]
    n = leading_true(s.sampler.uniform(g, x.device) * px < qx)
    s.commit(n, s.sampler.sample(q[n]))


def _sd_accepting_every_draft(s, state):
    """Another: accept every draft token (the output is then the draft's distribution)."""
    g = s.block_size()
    x, _ = s.draft_tokens(g)
    q = s.sampler.probs(s.target.forward(s.ids, s.length + g, g + 1))
    s.commit(g, s.sampler.sample(q[g]))


@pytest.mark.parametrize("wrong", [_sd_resampling_from_q, _sd_accepting_every_draft])
def test_the_test_rejects_a_wrong_acceptance_rule(setup, wrong):
    models, ids, dist = setup
    counts = sample_counts(models, ids, "sd", block=wrong)
    assert p_value(counts, dist) < ALPHA
