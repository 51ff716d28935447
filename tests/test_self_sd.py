"""Self-speculative decoding (`self_sd`): the slim drafts, the full model verifies. Greedy output equals
`generate(do_sample=False)` on every decoder-only layout the engine routes, with and without reuse (where the
full model runs only the layers after the shared prefix), a prefix mask's early exit included; sampled output
has the target's distribution; the command line decodes with no draft model."""

import json

import pytest
from conftest import PROMPTS
from test_distribution import ALPHA, exact_two_token_distribution, p_value, sample_counts
from test_equivalence import MAIN_ARCHS, OTHER_ARCHS, hf_greedy
from test_stats import check_accounting

from viasd import DecodePolicy, RoutingMask, SlimVerifier, decode
from viasd.decoding.reuse import shared_prefix

N_NEW = 24


def self_sd(models, ids, slim, gamma=4, reuse=False, **kw):
    policy = DecodePolicy(method="self_sd", gamma=gamma, max_new_tokens=N_NEW, eos_token_ids=(), reuse=reuse, **kw)
    return decode(ids, policy, models.target, models.vocab_size, slims=[slim])


@pytest.mark.parametrize("arch", MAIN_ARCHS + OTHER_ARCHS)
def test_greedy_self_sd_equals_transformers(model_sets, tokenizer, arch):
    models = model_sets(arch)
    ids = tokenizer(PROMPTS[0])["input_ids"]
    reference = hf_greedy(models, ids, N_NEW, None)
    for gamma in (1, 3, 5):
        out = self_sd(models, ids, models.slims[0], gamma)
        assert out.token_ids == reference, gamma
        check_accounting(out.stats)
        assert "draft" not in out.stats.passes and out.stats.passes["slim"] > 0


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("keep", [[0, 1], [0, 2]])
def test_reuse_shares_the_drafts_layers_with_the_verification(model_sets, tokenizer, arch, keep):
    """With reuse, the slim's leading layers are the trunk: computed once per position while drafting, the
    verification runs only layers k..L-1 (a prefix mask is an early exit: the draft computes no layer of its own);
    the tokens are those of the unshared run, and greedy `ar`'s."""
    models = model_sets(arch)
    L = models.target.config.num_hidden_layers
    slim = SlimVerifier(models.target, RoutingMask.from_layers(keep, L))
    k = shared_prefix(slim).k
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        shared, plain = self_sd(models, ids, slim, reuse=True), self_sd(models, ids, slim, reuse=False)
        assert shared.token_ids == plain.token_ids == hf_greedy(models, ids, N_NEW, None)
        assert shared.stats.passes["target"] == plain.stats.passes["target"]
        assert shared.stats.layer_tokens["target"] == (L - k) * shared.stats.tokens_processed["target"]
        assert sum(shared.stats.layer_tokens.values()) < sum(plain.stats.layer_tokens.values())
        assert "trunk" not in plain.stats.passes


def test_sampled_self_sd_has_the_targets_distribution(model_sets, tokenizer):
    models = model_sets("llama")
    ids = tokenizer("def parse(self, text):\n")["input_ids"]
    dist = exact_two_token_distribution(models, ids)
    counts = sample_counts(models, ids, "self_sd")
    assert p_value(counts, dist) > ALPHA


def test_self_sd_needs_a_slim_not_a_draft(model_sets, tokenizer):
    from viasd.errors import PolicyError

    models = model_sets("llama")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    policy = DecodePolicy(method="self_sd", gamma=3, max_new_tokens=4, eos_token_ids=())
    assert not policy.needs_draft and policy.needs_slim and policy.lossless
    with pytest.raises(PolicyError, match="slim verifier"):
        decode(ids, policy, models.target, models.vocab_size)
    assert decode(ids, policy, models.target, models.vocab_size, draft=None,
                  slims=models.slims).stats.passes.get("draft") is None


def test_generate_self_sd_from_the_command_line_without_a_draft(pair_dirs, capsys):
    from viasd.cli import main

    target, _ = pair_dirs("llama")
    args = ["generate", "--target", str(target), "--max-new-tokens", "8", "--prompt", "def f(x):", "--json",
            "--device", "cpu"]
    assert main([*args, "--method", "self_sd", "--keep-layers", "0,1", "--gamma", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) == 8 and out["policy"]["method"] == "self_sd"
    assert main([*args, "--method", "ar"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == out["token_ids"]


def test_bench_sets_self_sd_beside_transformers_early_exit(pair_dirs, tokenizer):
    """`viasd bench` on a target whose slim keeps a prefix: transformers' self-speculation (`assistant_early_exit`
    at the prefix's length) and ours write `ar`'s tokens (the bench refuses to time otherwise), and their ratio is
    reported; a slim that is not a prefix is refused for `hf_early_exit` with one clear error."""
    from viasd import load_models
    from viasd.bench.methods import BenchError, early_exit_layers, method_table
    from viasd.bench.timing import run_benchmark

    target, _ = pair_dirs("llama")
    models = load_models(target, masks=[[0, 1]], device="cpu", dtype="float32")
    assert early_exit_layers(models) == 2
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS[:2]]
    names = ["hf_ar", "hf_early_exit", "ar", "self_sd"]
    res = run_benchmark(models, prompts, method_table(models, names, 3, 8), 8, repeats=1, progress=False)
    assert set(res["methods"]) == set(names) and res["ratios"]["self_sd_vs_hf_early_exit"] > 0
    assert res["methods"]["self_sd"]["quality"]["fidelity"] == 1.0
    with pytest.raises(BenchError, match="prefix"):
        method_table(load_models(target, masks=[[0, 2]], device="cpu", dtype="float32"), ["hf_early_exit"], 3, 8)
    with pytest.raises(BenchError, match="need a draft model"):
        method_table(models, ["sd"], 3, 8)
    # VIA-SD on the self-drafter: the target's first layer drafts, the slim (layers 0, 1) is the middle tier
    models.set_self_drafter([0])
    names = ["ar", "sd-drafter_self", "viasd-drafter_self"]
    viasd = {"tau_accept": 0.5, "tau_slim": 0.3}
    res = run_benchmark(models, prompts, method_table(models, names, 3, 8, viasd), 8, repeats=1, progress=False)
    assert res["methods"]["sd-drafter_self"]["quality"]["fidelity"] == 1.0  # the bench checked its tokens are ar's
    assert res["intervals"]["viasd-drafter_self_vs_sd-drafter_self"]["ratio"] > 0, res["intervals"]
    assert res["methods"]["viasd-drafter_self"]["quality"]["fidelity"] is not None


def _with_self_drafter(models, draft_layers, slim_layers):
    """The loaded pair with the target's `draft_layers` as its drafter (`drafter: self`) and a slim keeping
    `slim_layers` (shared weights, nothing copied)."""
    L = models.target.config.num_hidden_layers
    view = models.with_slims([SlimVerifier(models.target, RoutingMask.from_layers(slim_layers, L))])
    view.set_self_drafter(draft_layers)
    return view


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_self_drafter_under_sd_and_viasd_is_greedy_generate(model_sets, tokenizer, arch):
    """VIA-SD on self-speculation: the target's first layer drafts, a deeper slim (layers 0-2) is the middle tier,
    the full model the last. Every lossless composition writes `generate(do_sample=False)`'s tokens, one prompt at a
    time and in a batch; the drafter's passes run its one layer only."""
    view = _with_self_drafter(model_sets(arch), [0], [0, 1, 2])
    off = dict(method="viasd", tau_accept=float("inf"), tau_slim=float("inf"))
    policies = [DecodePolicy(method="sd", gamma=3, drafter="self", max_new_tokens=N_NEW, eos_token_ids=()),
                DecodePolicy(**off, gamma=3, drafter="self", max_new_tokens=N_NEW, eos_token_ids=()),
                DecodePolicy(method="cascade_sd", gamma=2, drafter="self", max_new_tokens=N_NEW, eos_token_ids=())]
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    references = [hf_greedy(view, ids, N_NEW, None) for ids in prompts]
    for policy in policies:
        for ids, reference in zip(prompts, references):
            out = view.generate(ids, policy)
            assert out.token_ids == reference, policy.method
            check_accounting(out.stats)
            assert out.stats.layer_tokens["draft"] == out.stats.tokens_processed["draft"] > 0  # one layer a token
        assert [r.token_ids for r in view.generate(prompts, policy, batch_size=2)] == references, policy.method
    # the tiers on: the slim settles blocks the full model never sees
    on = view.generate(prompts[0], DecodePolicy(method="viasd", gamma=3, tau_accept=0.5, tau_slim=0.3, drafter="self",
                                                max_new_tokens=N_NEW, eos_token_ids=()))
    check_accounting(on.stats)
    assert on.stats.accepted_direct + on.stats.accepted_slim > 0


def test_sampled_viasd_on_the_self_drafter_has_the_targets_distribution(model_sets, tokenizer):
    import copy

    models = model_sets("llama")
    ids = tokenizer("def parse(self, text):\n")["input_ids"]
    dist = exact_two_token_distribution(models, ids)
    view = copy.copy(_with_self_drafter(models, [0], [0, 1, 2]))
    view.draft = view.self_drafter  # what `drafter: self` hands `decode`
    counts = sample_counts(view, ids, "viasd", tau_accept=float("inf"), tau_slim=float("inf"))
    assert p_value(counts, dist) > ALPHA


def test_the_self_drafter_needs_a_deeper_slim_and_no_draft_model(model_sets, tokenizer, pair_dirs, capsys):
    from viasd.cli import main
    from viasd.errors import PolicyError

    view = _with_self_drafter(model_sets("llama"), [0, 1], [0, 2])
    with pytest.raises(PolicyError, match="must keep more layers than the drafter"):
        view.generate(PROMPTS[0], DecodePolicy(method="viasd", gamma=3, tau_accept=0.5, tau_slim=0.3, drafter="self",
                                               max_new_tokens=4))
    bare = model_sets("llama").with_slims([])  # no self-drafter set
    with pytest.raises(PolicyError, match="drafter: self needs"):
        bare.generate(PROMPTS[0], DecodePolicy(method="sd", gamma=3, drafter="self", max_new_tokens=4))
    # from the command line: no --draft, the target's own layer drafts; sd's tokens are ar's
    target, _ = pair_dirs("llama")
    args = ["generate", "--target", str(target), "--max-new-tokens", "8", "--prompt", "def f(x):", "--json",
            "--device", "cpu"]
    assert main([*args, "--method", "viasd", "--draft-layers", "0", "--keep-layers", "0,1,2", "--gamma", "3",
                 "--tau-accept", "inf", "--tau-slim", "inf"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy"]["drafter"] == "self" and len(out["token_ids"]) == 8
    assert main([*args, "--method", "ar"]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == out["token_ids"]
