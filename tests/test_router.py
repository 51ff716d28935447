"""Tier decisions as classification: the oracle router (exact ceiling), the learned router in the decode
loop, the router's training rows, the fit (hand-computed AUC / ECE, recovery of a known model), and
the passes the engine no longer loses (catch-up folded into the block's full pass, block re-verification)."""

import json
import math
from dataclasses import replace

import pytest
import torch
from conftest import PROMPTS
from test_stats import check_accounting

from viasd import DecodePolicy, load_models
from viasd.decoding.tier_router import FEATURES, LearnedRouter, LogisticHead, RouterRows
from viasd.errors import PolicyError, ViasdError
from viasd.metrics.model_metrics import score_outputs
from viasd.training.tier_router import auc, fit_router, heldout_rows, load_router, reliability, save_router

N_NEW = 40


def _run(models, ids, router_rows=None, **kw):
    return models.generate(ids, DecodePolicy(gamma=4, max_new_tokens=N_NEW, eos_token_ids=(), **kw),
                           router_rows=router_rows)


def _fidelity(models, ids, tokens):
    pooled, _ = score_outputs(models.target, [ids], [tokens], models.vocab_size)
    return pooled["fidelity"]


@pytest.mark.parametrize("reuse", [False, True])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_oracle_is_the_targets_greedy_output(model_sets, tokenizer, arch, reuse):
    """The oracle settles only tokens equal to the target's greedy choice: its output is greedy `ar`'s,
    fidelity exactly 1, and its peek passes are counted apart from the method's passes."""
    models = model_sets(arch)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        ar = _run(models, ids, method="ar").token_ids
        r = _run(models, ids, method="viasd", router="oracle", reuse=reuse)
        s = r.stats
        assert r.token_ids == ar
        assert _fidelity(models, ids, r.token_ids) == 1.0
        check_accounting(s)
        assert "peek" not in s.passes and s.peek_passes == s.blocks - s.gated_blocks > 0
        assert s.slim_error_rate is not None and 0 <= s.slim_error_rate <= 1
        # the oracle escalates exactly where neither the draft nor the slim is right
        assert s.position_escalation_rate <= s.slim_error_rate + 1e-9


@pytest.mark.parametrize("reuse", [False, True])
@pytest.mark.parametrize("gamma", [2, 3, 6])
def test_oracle_reading_the_greedy_reference_decodes_as_the_peeking_oracle(model_sets, tokenizer, gamma, reuse):
    """Given the target's greedy output (`ar`'s tokens), the oracle reads its block targets there instead of
    running peek passes: the same tokens, router rows and statistics as the oracle that peeks, every block but
    at most the last ones (whose rows may run past the reference) served without a pass. Rows past a short
    reference's end, or a reference the output leaves (a wrong one here), cost peeks from that block on: still
    the target's greedy output."""
    models = model_sets("llama")
    max_new = 37
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        policy = DecodePolicy(method="viasd", router="oracle", gamma=gamma, max_new_tokens=max_new, eos_token_ids=(),
                              reuse=reuse)
        ar = models.generate(ids, replace(policy, method="ar")).token_ids
        rows_peek, rows_ref = RouterRows(), RouterRows()
        peek = models.generate(ids, policy, router_rows=rows_peek)
        ref = models.generate(ids, policy, router_rows=rows_ref, oracle_reference=ar)
        assert ref.token_ids == peek.token_ids == ar
        a, b = peek.stats.as_dict(), ref.stats.as_dict()
        timing = {"wall_time_s", "time_s", "pass_width_s", "peek_time_s", "peek_passes", "peek_from_reference",
                  "tokens_per_second", "router_time_s", "prefill_time_s", "decode_time_s",
                  "decode_seconds_per_token"}
        assert {k: v for k, v in a.items() if k not in timing} == {k: v for k, v in b.items() if k not in timing}
        blocks = peek.stats.peek_passes
        assert ref.stats.peek_from_reference + ref.stats.peek_passes == blocks
        assert ref.stats.peek_passes <= gamma  # blocks that start within gamma tokens of the end, each emits one or more
        short = models.generate(ids, policy, oracle_reference=ar[:20])  # rows past its end: peeks
        assert short.token_ids == ar and short.stats.peek_passes >= 1 and short.stats.peek_from_reference >= 1
        for key in ("features", "draft_right", "slim_right"):
            assert torch.equal(torch.nan_to_num(rows_peek.tensors()[key], -1), torch.nan_to_num(rows_ref.tensors()[key], -1))
        wrong = ar[:5] + [(t + 1) % models.vocab_size for t in ar[5:]]
        off = models.generate(ids, policy, oracle_reference=wrong)
        assert off.token_ids == ar and off.stats.peek_passes > blocks // 2
    budget = models.generate(ids, replace(policy, oracle_budget=0.2), oracle_reference=ar)
    assert budget.stats.peek_from_reference == 0  # a budgeted oracle reads rows after a wrong token: it peeks


def test_budgeted_oracle_spends_its_fidelity_budget(model_sets, tokenizer):
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    exact = _run(models, ids, method="viasd", router="oracle")
    budget = _run(models, ids, method="viasd", router="oracle", oracle_budget=0.2)
    s = budget.stats
    check_accounting(s)
    assert 0 < s.oracle_settled_wrong <= 0.2 * N_NEW
    assert s.passes["target"] < exact.stats.passes["target"]
    assert _fidelity(models, ids, budget.token_ids) >= 1 - 0.2 - 1e-9
    with pytest.raises(PolicyError, match="greedy"):
        DecodePolicy(router="oracle", sampling=__import__("viasd").SamplingConfig(temperature=1.0))
    with pytest.raises(PolicyError, match="oracle_budget"):
        DecodePolicy(router="oracle", oracle_budget=1.0)


def _constant_router(p_draft: float, p_slim: float) -> LearnedRouter:
    def head(p):
        n = len(FEATURES)
        return LogisticHead(torch.zeros(n), torch.ones(n), torch.zeros(n), math.log(p / (1 - p)))

    return LearnedRouter(head(p_draft), head(p_slim))


def test_learned_router_decides_the_tiers(model_sets, tokenizer):
    """A router sure the draft is always right (and the slim never) settles every draft token and
    withholds every bonus: the output is the draft's own greedy decode. One sure of neither escalates
    every block at its first position: the output is `sd`'s, and so greedy `ar`'s."""
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[1])["input_ids"]
    draft_alone = models.with_slims([])
    draft_alone.target, draft_alone.draft = models.draft, None
    draft_greedy = _run(draft_alone, ids, method="ar").token_ids
    ar = _run(models, ids, method="ar").token_ids
    sure = models.with_slims(models.slims)
    sure.router = _constant_router(0.99, 0.01)
    r = _run(sure, ids, method="viasd", router="learned", tau_accept=0.5, tau_slim=0.5)
    assert r.token_ids == draft_greedy and r.stats.passes["target"] == 0
    assert r.stats.bonus_withheld == r.stats.blocks and r.stats.router_time_s > 0
    check_accounting(r.stats)
    unsure = models.with_slims(models.slims)
    unsure.router = _constant_router(0.01, 0.01)
    r = _run(unsure, ids, method="viasd", router="learned", tau_accept=0.5, tau_slim=0.5)
    assert r.token_ids == ar and r.stats.escalated_blocks == r.stats.blocks
    assert r.stats.position_escalation_rate == 1.0


def test_learned_router_needs_a_router_and_its_probe(model_sets, tokenizer):
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[1])["input_ids"]
    with pytest.raises(PolicyError, match="needs a fitted router"):
        _run(models, ids, method="viasd", router="learned")
    probed = models.with_slims(models.slims)
    probed.router = _constant_router(0.5, 0.5)
    probed.router.probe_layers = 3  # the mask [0, 2] shares one layer with the target, not three
    with pytest.raises(PolicyError, match="first 3 layers"):
        _run(probed, ids, method="viasd", router="learned", reuse=True)
    with pytest.raises(PolicyError, match="collect them with router='oracle'"):
        _run(models, ids, router_rows=RouterRows(), method="viasd")


@pytest.mark.parametrize("reuse", [False, True])
def test_router_rows_from_oracle_decodes(model_sets, tokenizer, reuse):
    """Rows stop at a block's first wrong draft token; a bonus row (no draft token) has a NaN draft label;
    with a shared trunk every row carries its hidden state."""
    models = model_sets("llama")
    rows = RouterRows()
    for k, prompt in enumerate(PROMPTS):
        rows.current_group = k
        _run(models, tokenizer(prompt)["input_ids"], router_rows=rows, method="viasd", router="oracle", reuse=reuse)
    t = rows.tensors()
    n = len(rows)
    assert n == len(t["features"]) == len(t["slim_right"]) == len(t["group"]) > 0
    assert t["hidden"].shape == ((n, 64) if reuse else (n, 0))
    bonus = t["features"][:, FEATURES.index("bonus")] == 1
    assert torch.equal(torch.isnan(t["draft_right"]), bonus)
    for block in rows.draft_right:  # only the last row of a block may be a wrong draft token
        assert (block[:-1] == 1).all()
    assert set(t["group"].tolist()) == {0, 1, 2}


def test_auc_and_ece_by_hand():
    y = torch.tensor([0, 0, 1, 1])
    assert auc(y, torch.tensor([0.1, 0.4, 0.35, 0.8])) == pytest.approx(0.75)
    assert auc(torch.tensor([0, 1]), torch.tensor([0.5, 0.5])) == pytest.approx(0.5)
    assert auc(torch.tensor([1, 1]), torch.tensor([0.2, 0.3])) is None
    # bins [0.1, 0.2): predicted 0.15, observed 0 (2 rows); [0.9, 1): predicted 0.95, observed 0.5 (2 rows)
    ece, bins = reliability(torch.tensor([0, 0, 1, 0]), torch.tensor([0.1, 0.2 - 1e-6, 0.9, 0.99]))
    assert ece == pytest.approx(0.5 * 0.15 + 0.5 * 0.445, abs=1e-5)
    assert [b["n"] for b in bins] == [2, 2]


def test_fit_recovers_a_known_logistic_model(tmp_path):
    """Rows drawn from a known logistic model: the fitted heads rank held-out rows as well as the truth
    does, and are calibrated (small ECE); saved and loaded, they give the same probabilities."""
    g = torch.Generator().manual_seed(0)
    n = 6000
    features = torch.randn((n, len(FEATURES)), generator=g)
    true_w = torch.linspace(-1.5, 1.5, len(FEATURES))
    logits = features @ true_w + 0.3
    draft = (torch.rand(n, generator=g) < torch.sigmoid(logits)).float()
    slim = (torch.rand(n, generator=g) < torch.sigmoid(-logits)).float()
    rows = {"features": features, "hidden": torch.zeros((n, 0)), "draft_right": draft, "slim_right": slim,
            "group": torch.arange(n) // 60}
    router = fit_router(rows, seed=1)
    held = router.info["draft"]
    assert held["heldout_rows"] > 1000
    test = heldout_rows(rows["group"], 0.25, 1)
    truth = auc(draft[test], torch.sigmoid(logits[test]))
    assert held["auc"] == pytest.approx(truth, abs=0.01)
    assert held["ece"] < 0.03 and router.info["slim"]["ece"] < 0.03
    assert router.info["slim"]["auc"] > 0.8
    path = tmp_path / "router.json"
    save_router(router, path)
    loaded = load_router(path)
    a, b = router.probabilities(features[:5]), loaded.probabilities(features[:5])
    assert torch.allclose(a[0], b[0]) and torch.allclose(a[1], b[1])
    with pytest.raises(ViasdError, match="train-router"):
        load_router(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"format": 1, "features": ["x"]}')
    with pytest.raises(ViasdError, match="other router features"):
        load_router(tmp_path / "bad.json")


def test_a_head_whose_labels_hold_one_class_is_their_smoothed_rate():
    """A drafter the target agreed with on every training row (a self-drafter on a tiny model): no feature can
    separate the draft-right labels, so that head gives every row the rate (k + 1) / (n + 2), a calibrated constant,
    while the other head is fitted as usual."""
    g = torch.Generator().manual_seed(0)
    n = 600
    features = torch.randn((n, len(FEATURES)), generator=g)
    slim = (torch.rand(n, generator=g) < torch.sigmoid(2 * features[:, 0])).float()
    rows = {"features": features, "hidden": torch.zeros((n, 0)), "draft_right": torch.ones(n), "slim_right": slim,
            "group": torch.arange(n) // 20}
    router = fit_router(rows, seed=1)
    train = router.info["draft"]["train_rows"]
    p_draft, p_slim = router.probabilities(features[:50])
    assert torch.allclose(p_draft, torch.full_like(p_draft, (train + 1) / (train + 2)))
    assert router.info["draft"]["auc"] is None and router.info["slim"]["auc"] > 0.8
    assert p_slim.std() > 0.1


def test_fit_chooses_the_probe_and_l2_on_validation_decodes():
    """`fit_router` with candidates: a probe of pure noise (many dimensions, few rows) is left out, a probe
    that carries the signal is kept; each head's L2 is one of the candidates, the choice is traced with its
    validation loss, and the held-out decodes take no part in it (their labels flipped, the same choice)."""
    g = torch.Generator().manual_seed(0)
    n, h = 3000, 200
    features = torch.randn((n, len(FEATURES)), generator=g)
    hidden = torch.randn((n, h), generator=g)
    groups = torch.arange(n) // 30

    def rows(signal):
        logits = 1.5 * signal + 0.5
        return {"features": features, "hidden": hidden, "group": groups,
                "draft_right": (torch.rand(n, generator=g) < torch.sigmoid(logits)).float(),
                "slim_right": (torch.rand(n, generator=g) < torch.sigmoid(-logits)).float()}

    noise = fit_router(rows(features[:, 0]), (0, 6), (1e-5, 1e-2), seed=2)
    assert noise.probe_layers == 0 and noise.info["probe_dims"] == 0
    assert noise.probabilities(features[:3])[1].shape == (3,)  # no hidden state needed
    trace = noise.info["selection"]
    assert len(trace) == 2 * 2 * 2 and {r["probe_layers"] for r in trace} == {0, 6}
    for head in ("draft", "slim"):
        chosen = noise.info[head]["l2"]
        assert chosen in (1e-5, 1e-2)
        own = [r for r in trace if r["head"] == head and r["probe_layers"] == 0]
        assert chosen == min(own, key=lambda r: r["validation_log_loss"])["l2"]
    # the held-out decodes take no part in the choice: their labels flipped, the same trace
    flipped = rows(features[:, 0])
    again = fit_router(flipped, (0, 6), (1e-5, 1e-2), seed=2)
    held = heldout_rows(groups, 0.25, 2)
    for key in ("draft_right", "slim_right"):
        flipped[key] = torch.where(held, 1 - flipped[key], flipped[key])
    assert fit_router(flipped, (0, 6), (1e-5, 1e-2), seed=2).info["selection"] == again.info["selection"]
    probed = fit_router(rows(hidden[:, :4].sum(-1)), (0, 6), (1e-5, 1e-2), seed=2)
    assert probed.probe_layers == 6 and probed.info["slim"]["auc"] > 0.8
    single = fit_router(rows(features[:, 0]), 0, 1e-3, seed=2)
    assert single.info["selection"] == [] and single.info["l2"] == {"draft": 1e-3, "slim": 1e-3}


def test_catch_up_is_folded_into_the_blocks_full_pass(model_sets, tokenizer):
    """max_lag: the block after the lag grows too long goes to the full model, one pass that catches up
    and verifies; every full pass is an escalated block's."""
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    r = _run(models, ids, method="viasd", tau_accept=0.0, tau_slim=math.inf, max_lag=3, verify_lagged=False)
    s = r.stats
    check_accounting(s)
    assert s.catchup_passes > 0 and s.passes["target"] == s.escalated_blocks
    # the full model's lag never passes max_lag + one block
    assert s.passes["target"] >= N_NEW // (3 + 4 + 1) - 1


def test_verify_block_rechecks_the_escalated_blocks_own_positions(model_sets, tokenizer):
    """Tier 2 off (no regeneration, no bonus), tier 1 lenient: with verify_block an escalated block is verified
    from position 0, so tier 1 keeps only the tokens of blocks that never escalated (each withheld its bonus:
    `gamma` tokens each, the last block maybe fewer); without it, escalated blocks keep their tier-1 prefix."""
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[2])["input_ids"]
    kw = dict(method="viasd", tau_accept=1.2, tau_slim=math.inf, verify_lagged=False)
    again = _run(models, ids, verify_block=True, **kw).stats
    check_accounting(again)
    settled_blocks = again.bonus_withheld
    assert again.lagged_checked == 0 and settled_blocks > 0 and again.escalated_blocks > 0
    assert 4 * (settled_blocks - 1) < again.accepted_direct <= 4 * settled_blocks
    plain = _run(models, ids, **kw).stats
    assert plain.accepted_direct > 4 * plain.bonus_withheld  # tier-1 prefixes of escalated blocks kept


def test_router_stage_fits_and_a_decode_uses_it(study):
    """`viasd train-router` on the smoke family: the router file with held-out figures and its plot, the
    probe on the shared trunk; a decode with it runs, and its tier decisions follow its probabilities."""
    from viasd.decoding.reuse import prefix_length
    from viasd.stages.dimr_search import run_dimr_stage
    from viasd.stages.train_router import run_router_stage
    from viasd.study.paths import mask_paths, router_paths

    _, params = study
    run_dimr_stage(params, progress=False)
    out = run_router_stage(params, progress=False)
    paths = router_paths(params, "smoke")
    assert paths["router"].exists() and paths["plot"].exists()
    router = load_router(paths["router"])
    keep = json.loads(mask_paths(params)["mask"].read_text())["keep_layers"]
    assert router.probe_layers == prefix_length(keep) == out["config"]["probe_layers"]
    assert router.info["rows"] == out["metrics"]["rows"] >= 50 and router.info["heldout_rows"] > 0
    assert router.info["collect"]["gamma"] == 6 and router.info["oracle"]["tokens"] == 6 * 24
    for head in ("draft", "slim"):
        info = router.info[head]
        assert info["auc"] is None or 0 <= info["auc"] <= 1
        assert 0 <= info["ece"] <= 1 and sum(b["n"] for b in info["reliability"]) == info["heldout_rows"]
    assert router.info["decision_seconds_per_block"] > 0  # measured, reported; speed is never asserted
    models = load_models(params.model_dir("target"), draft=params.model_dir("draft"), masks=[mask_paths(params)["mask"]],
                         device="cpu", dtype="float32")
    models.router = router
    prompt = list(range(5, 30))
    r = _run(models, prompt, method="viasd", router="learned", tau_accept=0.6, tau_slim=0.6, reuse=True)
    check_accounting(r.stats)
    assert len(r.token_ids) == N_NEW and r.stats.router_time_s > 0


def test_decode_key_shares_a_decode_only_between_identical_runs():
    """Runs decode alike iff their policies are equal and so are their slims, unless every tier is off (no
    slim pass runs then): the decode stage decodes such runs once (`same_decode_as`)."""
    from viasd.stages.decode import decode_key

    tuned = DecodePolicy(method="viasd", gamma=3, tau_accept=0.9, tau_slim=0.7, max_new_tokens=8)
    off = DecodePolicy(method="viasd", gamma=4, tau_accept=math.inf, tau_slim=math.inf, max_new_tokens=8)
    assert decode_key(tuned, [0, 1, 2]) == decode_key(tuned, [0, 1, 2]) != decode_key(tuned, [0, 2, 4])
    assert decode_key(off, [0, 1, 2]) == decode_key(off, "independent") == decode_key(off, [3, 5])
    assert decode_key(off, [0, 1, 2]) != decode_key(tuned, [0, 1, 2])
    assert decode_key(DecodePolicy(method="sd", gamma=4), None) != decode_key(off, None)  # another method
    assert decode_key(tuned, [0, 1]) != decode_key(replace(tuned, tau_slim=0.8), [0, 1])


def test_the_report_names_the_runs_that_share_a_decode():
    from viasd.report.tables import shared_decodes

    evals = [{"run": "viasd"}, {"run": "viasd-mask_truncate", "same_decode_as": "viasd"},
             {"run": "viasd-mask_random", "same_decode_as": None}, {"run": "viasd-rules", "same_decode_as": "viasd-mask_random"},
             {"run": "viasd-gamma_2", "same_decode_as": "viasd"}]
    line = shared_decodes(evals)
    assert "`viasd-mask_truncate`, `viasd-gamma_2` as `viasd`; `viasd-rules` as `viasd-mask_random`" in line
    assert shared_decodes([{"run": "sd"}, {"run": "ar", "same_decode_as": None}]) == ""


def test_headroom_share_by_hand():
    from viasd.decoding.tier_router import headroom_share

    assert headroom_share(1.1, 1.2) == pytest.approx(0.5)  # 10 % of the oracle's 20 %
    assert headroom_share(0.95, 1.25) == pytest.approx(-0.2)  # slower than SD: a negative share
    assert headroom_share(1.1, 1.0) is None and headroom_share(None, 1.2) is None  # no headroom, no share


def test_position_features_by_hand():
    """One draft position and the bonus row over a 3-token vocabulary, every feature computed by hand."""
    from viasd.decoding.tier_router import position_features

    p = torch.tensor([[0.5, 0.25, 0.25]])
    q = torch.tensor([[0.25, 0.5, 0.25], [0.8, 0.1, 0.1]])
    x = torch.tensor([1])
    f = position_features(p, q, x)
    col = {name: f[:, i] for i, name in enumerate(FEATURES)}
    ln = math.log
    assert col["log_p_x"].tolist() == pytest.approx([ln(0.25), 0.0])
    assert col["log_q_x"].tolist() == pytest.approx([ln(0.5), 0.0])
    assert col["log_ratio"][0] == pytest.approx(ln(2.0))
    assert col["log_q_max"].tolist() == pytest.approx([ln(0.5), ln(0.8)])
    assert col["log_p_max"].tolist() == pytest.approx([ln(0.5), 0.0])
    assert col["q_margin"].tolist() == pytest.approx([0.25, 0.7])
    h = -(0.25 * ln(0.25) * 2 + 0.5 * ln(0.5))
    assert col["q_entropy"].tolist() == pytest.approx([h, -(0.8 * ln(0.8) + 0.2 * ln(0.1))])
    assert col["p_entropy"].tolist() == pytest.approx([h, 0.0])
    assert col["agree"].tolist() == [1.0, 0.0] and col["position"].tolist() == [0.0, 1.0]
    assert col["bonus"].tolist() == [0.0, 1.0]
    assert col["log_q_second"].tolist() == pytest.approx([ln(0.25), ln(0.1)])


def test_report_gives_the_oracle_headroom_measured_and_modelled():
    """The report's oracle lines: `viasd` and the oracles against `sd`, each measured (the geometric mean of per-prompt
    paired ratios of decode seconds per token) and modelled (their passes under the cost model), and the share of
    each oracle's headroom `viasd` takes, the budgeted oracle's first; by hand."""
    from viasd.report.headroom import oracle_headroom
    from viasd.search.pass_cost import PassCost

    def run(name, speed, target_passes, **extra):
        # two prompts from two files, one at `speed` and one at `speed` x 1.1 over a base of 0.01 s/token
        widths = {"draft:1/1": 400, "target:12/5": target_passes}
        return {"run": name, "new_tokens": 100, "pass_widths": widths, "pass_width_s": {k: 0.0 for k in widths},
                "speed": {"ids": ["a", "b"], "groups": ["f", "g"], "seconds_per_token": [0.01 / speed, 0.01 / (speed * 1.1)]},
                "policy": {"gamma": 4, "router": "learned"}, **extra}

    costs = {"draft:1": PassCost(0.001, 0.0), "target:12": PassCost(0.01, 0.0)}
    # modelled seconds per token: sd (0.4 + 0.4) / 100, viasd (0.4 + 0.2) / 100, oracle (0.4 + 0.1) / 100
    evals = [run("sd", 1.5, 40), run("viasd", 1.8, 20, position_escalation_rate=0.1),
             run("viasd-oracle", 2.1, 10, slim_error_rate=0.08)]
    line = oracle_headroom(evals, costs)
    assert "1.200× measured, 1.333× modelled" in line  # viasd: 1.8 / 1.5 on both prompts, 0.008 / 0.006
    assert "1.400× `sd` measured, 1.600× by the cost model" in line
    assert "takes 0.50 (measured) / 0.56 (modelled)" in line
    assert "escalated 0.100" in line and "wrong on 0.080" in line
    assert "no `sd`" in oracle_headroom(evals[:2], costs)
    assert "budgeted oracle" not in line
    # the budgeted oracle at the fidelity floor: (0.4 + 0.05) / 100 modelled, 2.4 / 1.5 = 1.6 measured; its share
    # comes first, the headline
    budgeted = run("viasd-oracle_budget", 2.4, 5, quality={"fidelity": 0.97, "task_drop": 0.4})
    budgeted["policy"]["oracle_budget"] = 0.05
    line = oracle_headroom([*evals, budgeted], costs)
    assert line.startswith("**Headroom at the fidelity floor:**") and "settle 0.05 of its tokens wrong" in line
    assert "1.600× `sd` measured, 1.778× by the cost model, fidelity 0.970, task drop 0.40" in line
    assert "takes **0.33** (measured) / 0.43 (modelled) of its headroom" in line  # 0.2 / 0.6, 0.333 / 0.778
    assert "own pass costs" not in line  # passes without timings: no job costs to fit
    # the job's own pass costs: the draft's passes took 3 ms and the target's 20 (3x and 2x the search's costs),
    # so sd (1.2 + 0.8) / 100 against viasd (1.2 + 0.4) / 100 and the oracle (1.2 + 0.2) / 100
    for e in evals:
        e["pass_width_s"] = {"draft:1/1": 0.003 * 400, "target:12/5": 0.02 * e["pass_widths"]["target:12/5"]}
    line = oracle_headroom(evals, costs)
    assert "1.333× modelled" in line  # the search's costs, as before
    assert "own pass costs (fitted on its runs' timed passes) `viasd` 1.250× and the oracle 1.429×" in line
