"""Unit tests on the maths: warping, residuals, acceptance tests, tier scores, cascade rules."""

import math

import pytest
import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from viasd.decoding.acceptance import lossless, proposal_test
from viasd.decoding.methods.spec_cascade import cascade_target, defer
from viasd.decoding.policy import DecodePolicy
from viasd.decoding.sampling import Sampler, SamplingConfig, residual
from viasd.decoding.tiers import CONFIDENCES, SCORES, direct_accept
from viasd.errors import PolicyError

CPU = torch.device("cpu")


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (0.9, 7, 0.6)])
def test_warp_matches_transformers_processors(temperature, top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(3, 50) * 3
    ours = Sampler(SamplingConfig(temperature, top_k, top_p), CPU, 0).probs(logits)
    procs = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k:
        procs.append(TopKLogitsWarper(top_k))
    if top_p < 1:
        procs.append(TopPLogitsWarper(top_p))
    theirs = torch.softmax(procs(torch.zeros(3, 1, dtype=torch.long), logits.clone()), dim=-1)
    torch.testing.assert_close(ours, theirs)


def test_residual_by_hand():
    q = torch.tensor([0.5, 0.3, 0.2])
    p = torch.tensor([0.2, 0.5, 0.3])
    torch.testing.assert_close(residual(q, p), torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(residual(q, q), q)  # empty residual falls back to q


def test_lossless_greedy_by_hand():
    sampler = Sampler(SamplingConfig(), CPU, 0)
    q_logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 2.0]])  # argmax 1, 0, 2
    assert lossless(torch.tensor([1, 0]), None, q_logits, sampler)[0] == 2
    n, token = lossless(torch.tensor([1, 2]), None, q_logits, sampler)
    assert (n, int(token)) == (1, 0)
    n, token = lossless(torch.tensor([2, 0]), None, q_logits, sampler)
    assert (n, int(token)) == (0, 1)


def test_proposal_test_acceptance_probability():
    """P(accept x) = min(1, q(x)/p(x)) for a one-token block, over many uniform draws."""
    sampler = Sampler(SamplingConfig(temperature=1.0), CPU, 0)
    p = torch.tensor([[0.6, 0.4]])
    q = torch.tensor([[0.3, 0.7]])
    trials = 4000
    accepted = sum(proposal_test(torch.tensor([0]), p, q, q[0], sampler)[0] for _ in range(trials))
    assert abs(accepted / trials - 0.5) < 0.03  # min(1, 0.3/0.6)
    accepted = sum(proposal_test(torch.tensor([1]), p, q, q[0], sampler)[0] for _ in range(200))
    assert accepted == 200  # q(x) > p(x): always


def test_scores_and_confidences_by_hand():
    q = torch.tensor([[0.7, 0.2, 0.1], [0.4, 0.4, 0.2]])
    p = torch.tensor([[0.35, 0.35, 0.3], [0.1, 0.8, 0.1]])
    x = torch.tensor([0, 1])
    torch.testing.assert_close(SCORES["ratio"].fn(q, p, x), torch.tensor([2.0, 0.5]))
    torch.testing.assert_close(SCORES["slim_prob"].fn(q, p, x), torch.tensor([0.7, 0.4]))
    torch.testing.assert_close(SCORES["ratio_argmax"].fn(q, p, x), torch.tensor([2.0, 0.0]))  # argmax of row 1 is 0
    h0 = -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))
    assert SCORES["neg_entropy"].fn(q, p, x)[0].item() == pytest.approx(-h0, rel=1e-5)
    kl1 = 0.4 * math.log(4) + 0.4 * math.log(0.5) + 0.2 * math.log(2)
    assert SCORES["neg_kl"].fn(q, p, x)[1].item() == pytest.approx(-kl1, rel=1e-5)
    torch.testing.assert_close(CONFIDENCES["max_prob"].fn(q), torch.tensor([0.7, 0.4]))
    torch.testing.assert_close(CONFIDENCES["margin"].fn(q), torch.tensor([0.5, 0.0]))


def test_direct_accept_modes():
    s = torch.tensor([2.0, 0.5, 1.0])
    score = SCORES["ratio"]
    assert direct_accept(score, s, 1.0, None).tolist() == [True, False, True]
    assert direct_accept(score, s, float("inf"), None).tolist() == [False, False, False]
    u = torch.tensor([0.9, 0.4, 0.6])  # sampling: accept iff u < s / tau, tau = 1
    assert direct_accept(score, s, 1.0, u).tolist() == [True, True, True]
    assert direct_accept(score, s, 2.0, u).tolist() == [True, False, False]


def test_cascade_rules_by_hand():
    p = torch.tensor([[0.9, 0.05, 0.05], [0.4, 0.3, 0.3]])
    q = torch.tensor([[0.2, 0.7, 0.1], [0.8, 0.1, 0.1]])
    assert defer("chow", 0.2, p, q).tolist() == [False, True]
    assert defer("diff", 0.1, p, q).tolist() == [False, True]
    # opt defers where max p < max q - alpha * TV(p, q). By hand: row 0, TV 0.7, 0.9 < 0.7 - 0.35 no; row 1,
    # TV 0.4, 0.4 < 0.8 - 0.2 yes; row 2 (p .5 .25 .25, q .6 .4 0), TV 0.25: 0.5 < 0.6 - 0.125 = 0.475 no at
    # alpha 0.5, 0.5 < 0.6 - 0.025 = 0.575 yes at alpha 0.1 (there `diff` at 0.1 defers too, `chow` does not)
    p3 = torch.cat([p, torch.tensor([[0.5, 0.25, 0.25]])])
    q3 = torch.cat([q, torch.tensor([[0.6, 0.4, 0.0]])])
    assert defer("opt", 0.5, p3, q3).tolist() == [False, True, False]
    assert defer("opt", 0.1, p3, q3).tolist() == [False, True, True]
    assert defer("opt", 0.0, p3, q3).tolist() == defer("diff", 0.0, p3, q3).tolist() == [False, True, True]
    for rule in ("chow", "diff", "opt", "token_v1", "token_v2", "token_v3"):
        pi = cascade_target(rule, 0.3, p, q)
        torch.testing.assert_close(pi.sum(-1), torch.ones(2))
        assert (pi >= 0).all()
    # token_v1, alpha 0.3: row 0 acceptable set {1} (0.7 >= 0.4), so pi = p*[0,1,0] + q*(0.95)
    expected = torch.tensor([0.2 * 0.95, 0.05 + 0.7 * 0.95, 0.1 * 0.95])
    torch.testing.assert_close(cascade_target("token_v1", 0.3, p, q)[0], expected)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(method="nope"), "unknown method"),
    (dict(gamma=0), "gamma"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(score="x"), "unknown score"),
    (dict(rule="x"), "unknown spec_cascade rule"),
    (dict(alpha=-1.0), "alpha"),
    (dict(max_lag=-1), "max_lag"),
    (dict(tau_accept=0.0, sampling=SamplingConfig(temperature=1.0)), "tau_accept must be > 0"),
])
def test_policy_errors(kwargs, needle):
    with pytest.raises(PolicyError, match=needle):
        DecodePolicy(**kwargs)


def test_sampling_config_errors():
    for kwargs in (dict(temperature=-1), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(PolicyError):
            SamplingConfig(**kwargs)


def test_levels_per_slim():
    policy = DecodePolicy(tau_accept=(1.0, 2.0), tau_slim=0.5)
    assert policy.levels(2) == ((1.0, 2.0), (0.5, 0.5))
    with pytest.raises(PolicyError, match="one per level"):
        policy.levels(3)
