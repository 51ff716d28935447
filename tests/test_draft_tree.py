"""Tree drafting (`draft_tree.py`): greedy `sd` over a draft tree equals `generate(do_sample=False)` for every
drafter (a draft model, a feature drafter on the trunk, a self-drafter) and cache kind; sampled output has the
target's distribution (SpecInfer's multi-draft test); a tree of one child per node is chain drafting pass for
pass; the tree's masks and compaction on their own; misuse gets one clear error."""

import pytest
import torch
from conftest import PROMPTS
from test_distribution import ALPHA, WARP, N, exact_two_token_distribution, p_value
from test_equivalence import hf_greedy
from test_stats import check_accounting

from viasd import DecodePolicy, RoutingMask, SlimVerifier, decode
from viasd.decoding.draft_tree import ROOT, DraftTree, accept, allowed_mask, keep_new_slots
from viasd.decoding.feature_drafter import FeatureDrafter
from viasd.decoding.kv_cache import model_cache
from viasd.decoding.sampling import Sampler, SamplingConfig
from viasd.errors import PolicyError

N_NEW = 20
TREES = [(4, 2), (10, 3), (24, 4)]  # (tree_nodes, tree_top_k)


def policy(gamma=3, nodes=10, top_k=3, **kw):
    return DecodePolicy(method="sd", gamma=gamma, max_new_tokens=N_NEW, eos_token_ids=(), tree_nodes=nodes,
                        tree_top_k=top_k, **kw)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "phi3", "gpt2", "gpt_neox", "opt"])
def test_greedy_tree_sd_equals_transformers(model_sets, tokenizer, arch):
    models = model_sets(arch)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        reference = hf_greedy(models, ids, N_NEW, None)
        for gamma in (1, 4):
            for nodes, top_k in TREES:
                for cache in ("inplace", "dynamic"):
                    out = decode(ids, policy(gamma, nodes, top_k, cache=cache), models.target, models.vocab_size,
                                 draft=models.draft)
                    assert out.token_ids == reference, (prompt, gamma, nodes, top_k, cache)
                    check_accounting(out.stats)
                    assert out.stats.drafted <= nodes * out.stats.blocks


def test_greedy_tree_with_a_feature_drafter_and_a_self_drafter_equals_transformers(model_sets, tokenizer):
    """The feature drafter expands nodes from its own outputs over the trunk's true features at the committed
    positions; the verification's trunk pass records the accepted nodes' features for the next tree."""
    for arch in ("llama", "qwen2"):
        models = model_sets(arch)
        torch.manual_seed(0)
        feature = FeatureDrafter(models.target, 2).eval()
        L = models.target.config.num_hidden_layers
        self_draft = SlimVerifier(models.target, RoutingMask.from_layers([0, 1], L))
        for prompt in [*PROMPTS, "x"]:
            ids = tokenizer(prompt)["input_ids"]
            reference = hf_greedy(models, ids, N_NEW, None)
            for drafter, draft in (("feature", feature), ("self", self_draft)):
                for nodes, top_k in TREES:
                    out = decode(ids, policy(4, nodes, top_k, drafter=drafter), models.target, models.vocab_size,
                                 draft=draft)
                    assert out.token_ids == reference, (arch, prompt, drafter, nodes, top_k)
                    check_accounting(out.stats)


def test_a_tree_of_one_child_per_node_is_chain_drafting(model_sets, tokenizer):
    """`tree_top_k = 1`: the same tokens, blocks, accepted tokens and passes per model as chain `sd`."""
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    for gamma in (1, 3, 5):
        chain = decode(ids, policy(gamma, 0), models.target, models.vocab_size, draft=models.draft).stats
        tree = decode(ids, policy(gamma, 64, 1), models.target, models.vocab_size, draft=models.draft).stats
        assert tree.new_tokens == chain.new_tokens and tree.blocks == chain.blocks
        assert tree.accepted_full == chain.accepted_full and tree.passes == chain.passes
        assert tree.tokens_processed == chain.tokens_processed


def test_a_wider_tree_accepts_at_least_as_much_per_block(model_sets, tokenizer):
    """Greedy: the dynamic tree holds the chain's path (the top child of the top node at each depth) when its
    budget allows, so it accepts no fewer tokens per block than the chain on the same prefix; over a decode,
    blocks differ, so only the first block is compared exactly."""
    models = model_sets("llama")
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        first = []
        for nodes, top_k in ((4, 1), (64, 4)):
            p = DecodePolicy(method="sd", gamma=4, max_new_tokens=5, eos_token_ids=(), tree_nodes=nodes,
                             tree_top_k=top_k)
            first.append(decode(ids, p, models.target, models.vocab_size, draft=models.draft).stats.accepted_full)
        assert first[1] >= first[0]


def test_sampled_tree_sd_has_the_targets_distribution(model_sets, tokenizer):
    models = model_sets("llama")
    ids = tokenizer("def parse(self, text):\n")["input_ids"]
    dist = exact_two_token_distribution(models, ids)
    counts = {}
    for seed in range(N):
        p = DecodePolicy(method="sd", gamma=2, max_new_tokens=2, sampling=WARP, seed=seed, eos_token_ids=(),
                         tree_nodes=5, tree_top_k=3)
        key = tuple(decode(ids, p, models.target, models.vocab_size, draft=models.draft).token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
    assert p_value(counts, dist) > ALPHA


def test_multi_draft_acceptance_emits_the_target_distribution_exactly():
    """SpecInfer's test on one node with three children drawn i.i.d. from `p`: the emitted token's frequency over
    many draws is `q`, for a `p` far from `q` (the test alone, no model)."""
    q_logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = torch.tensor([0.1, 0.1, 0.4, 0.4])
    sampler = Sampler(SamplingConfig(temperature=1.0), torch.device("cpu"), 0)
    counts = torch.zeros(4)
    draws = 20000
    for _ in range(draws):
        tree = DraftTree()
        tree.proposals[ROOT] = p
        for t in torch.multinomial(p, 3, replacement=True, generator=sampler.generator).tolist():
            tree.add(t, ROOT)
        path, token = accept(tree, q_logits.expand(1 + len(tree), -1), sampler)
        counts[tree.tokens[path[-1]] if path else token] += 1
    assert torch.allclose(counts / draws, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.015)


def test_a_node_sees_the_prefix_its_ancestors_and_itself():
    tree = DraftTree()
    a, b = tree.add(5, ROOT), tree.add(6, ROOT)
    a1 = tree.add(7, a)
    b1 = tree.add(8, b)
    allowed = allowed_mask(tree, [], [a, b, a1, b1], chain=2).int().tolist()
    assert allowed == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 0, 1, 0, 0],
                       [1, 1, 1, 0, 1, 0], [1, 1, 0, 1, 0, 1]]
    # a drafter pass over b1 alone with a, b, a1 in its cache: b1 reads b and itself
    assert allowed_mask(tree, [a, b, a1], [b1]).int().tolist() == [[0, 1, 0, 1]]
    sub, old = tree.subtree([a, b, b1])
    assert old == [a, b, b1] and sub.parents == [ROOT, ROOT, 1] and sub.tokens == [5, 6, 8]


@pytest.mark.parametrize("kind", ["inplace", "dynamic"])
def test_compaction_keeps_the_path_in_order(model_sets, kind):
    models = model_sets("llama")
    cache = model_cache(models.target, kind, 16)
    with torch.inference_mode():
        models.target(input_ids=torch.arange(1, 9)[None], cache=cache, use_cache=True)
    before = [layer.keys.clone() for layer in cache.layers]
    keep_new_slots(cache, 3, [1, 4])
    for layer, old in zip(cache.layers, before):
        assert layer.keys.shape[-2] == 5
        assert torch.equal(layer.keys[..., :3, :], old[..., :3, :])
        assert torch.equal(layer.keys[..., 3:, :], old[..., [4, 7], :])


def test_misuse_gets_one_clear_error(model_sets, tokenizer):
    models = model_sets("llama")
    with pytest.raises(PolicyError, match="method 'sd' only"):
        DecodePolicy(method="viasd", tree_nodes=8)
    with pytest.raises(PolicyError, match="cache 'inplace' or 'dynamic'"):
        DecodePolicy(method="sd", tree_nodes=8, cache="static")
    with pytest.raises(PolicyError, match="set one of them"):
        DecodePolicy(method="sd", tree_nodes=8, draft_stop=0.3)
    with pytest.raises(PolicyError, match="tree_nodes must be"):
        DecodePolicy(method="sd", tree_nodes=-1)
    with pytest.raises(PolicyError, match="one prompt at a time"):
        models.generate([PROMPTS[0], PROMPTS[1]], policy())
    gemma2 = model_sets("gemma2")  # sliding-window layers: a tree's cache is not compacted there
    with pytest.raises(PolicyError, match="sliding-window"):
        decode(tokenizer(PROMPTS[0])["input_ids"], policy(), gemma2.target, gemma2.vocab_size, draft=gemma2.draft)


def test_the_bench_times_a_tree_beside_its_drafters_chain(pair_dirs, tokenizer):
    """`viasd bench --methods sd,sd-tree,...`: the tree variant is the same drafter's `sd` drafting a tree of the
    bench's shape; its tokens are `ar`'s (the bench checks), and its speed over the chain has an interval."""
    from viasd import load_models
    from viasd.bench.methods import BenchError, method_table
    from viasd.bench.timing import run_benchmark

    target, draft = pair_dirs("llama")
    models = load_models(target, draft=draft, masks=[[0, 1]], device="cpu", dtype="float32")
    models.set_self_drafter([0])
    names = ["ar", "sd", "sd-tree", "sd-drafter_self", "sd-tree-drafter_self"]
    table = method_table(models, names, 3, 8, tree={"tree_nodes": 6, "tree_top_k": 2})
    trees = {m.name: m.policy for m in table if m.policy.tree_nodes}
    assert set(trees) == {"sd-tree", "sd-tree-drafter_self"}
    assert trees["sd-tree-drafter_self"].drafter == "self" and trees["sd-tree"].tree_top_k == 2
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS[:2]]
    res = run_benchmark(models, prompts, table, 8, repeats=1, progress=False)
    assert res["methods"]["sd-tree"]["quality"]["fidelity"] == 1.0
    assert res["intervals"]["sd-tree_vs_sd"]["ratio"] > 0 and res["intervals"]["sd-tree-drafter_self_vs_sd-drafter_self"]
    deeper = method_table(models, ["sd", "sd-tree"], 2, 8, tree={"tree_nodes": 6, "tree_top_k": 2, "gamma": 4})
    assert [m.policy.gamma for m in deeper] == [2, 4]  # the tree at its own depth beside the chain's block length
    with pytest.raises(BenchError, match="feature drafter"):
        method_table(models, ["sd-tree-drafter_feature"], 3, 8)


def test_generate_drafts_a_tree_from_the_command_line(pair_dirs, capsys):
    """`viasd generate --method sd --tree-nodes N --tree-top-k K`: ar's tokens; a tree under another method is one
    clear line, not a traceback."""
    import json

    from viasd.cli import main

    target, draft = pair_dirs("llama")
    common = ["--target", str(target), "--draft", str(draft), "--max-new-tokens", "12", "--device", "cpu",
              "--prompt", "def f(x):", "--json"]
    outs = {}
    for method, extra in (("ar", []), ("sd", ["--gamma", "3", "--tree-nodes", "6", "--tree-top-k", "2"])):
        assert main(["generate", *common, "--method", method, *extra]) == 0
        outs[method] = json.loads(capsys.readouterr().out)
    assert outs["sd"]["token_ids"] == outs["ar"]["token_ids"] and outs["sd"]["policy"]["tree_nodes"] == 6
    assert main(["generate", *common, "--method", "viasd", "--keep-layers", "0,2", "--tree-nodes", "6"]) == 2
    assert "method 'sd' only" in capsys.readouterr().err
