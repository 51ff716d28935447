"""Greedy invariants against transformers: `ar` == `generate(do_sample=False)`, `sd` and `cascade_sd`
== `ar`, `viasd` with tiers 1-2 off == `sd`, for several layouts, prompts and block lengths,
including an EOS that falls inside a block."""

import pytest
import torch
from conftest import PROMPTS

from viasd import DecodePolicy

MAIN_ARCHS = ["llama", "qwen2", "gpt2", "gpt_neox"]
OTHER_ARCHS = ["mistral", "qwen3", "gemma2", "phi3", "opt"]
OFF = float("inf")
N_NEW = 24


def hf_greedy(models, ids, n, eos):
    device = models.target.device
    out = models.target.generate(torch.tensor([ids], device=device),
                                 attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device),
                                 do_sample=False, max_new_tokens=n, eos_token_id=eos, pad_token_id=0,
                                 min_new_tokens=0 if eos is not None else n)
    return out[0, len(ids):].tolist()


def run(models, ids, method, gamma, eos=(), **kw):
    policy = DecodePolicy(method=method, gamma=gamma, max_new_tokens=N_NEW, eos_token_ids=eos, **kw)
    return models.generate(ids, policy)


def _eos_inside(models, ids):
    """A token that greedy `ar` emits a few tokens in: used as EOS so that decoding stops mid-block."""
    tokens = run(models, ids, "ar", 1).token_ids
    for pos in range(5, len(tokens)):
        if tokens[pos] not in tokens[:pos]:
            return tokens[pos]
    return tokens[5]


@pytest.mark.parametrize("arch", MAIN_ARCHS)
def test_greedy_methods_equal_transformers(model_sets, tokenizer, arch):
    models = model_sets(arch)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        reference = hf_greedy(models, ids, N_NEW, None)
        assert run(models, ids, "ar", 1).token_ids == reference
        for gamma in (1, 3, 5):
            sd = run(models, ids, "sd", gamma)
            assert sd.token_ids == reference, (prompt, gamma)
            assert run(models, ids, "cascade_sd", gamma).token_ids == reference, (prompt, gamma)
            off = run(models, ids, "viasd", gamma, tau_accept=OFF, tau_slim=OFF)
            assert off.token_ids == sd.token_ids, (prompt, gamma)
            assert off.stats.passes["target"] == sd.stats.passes["target"]


@pytest.mark.parametrize("arch", MAIN_ARCHS)
def test_eos_inside_a_block(model_sets, tokenizer, arch):
    models = model_sets(arch)
    ids = tokenizer(PROMPTS[0])["input_ids"]
    eos = _eos_inside(models, ids)
    reference = hf_greedy(models, ids, N_NEW, eos)
    assert reference[-1] == eos and len(reference) < N_NEW
    assert run(models, ids, "ar", 1, eos=(eos,)).token_ids == reference
    for gamma in (3, 5):
        for method in ("sd", "cascade_sd"):
            result = run(models, ids, method, gamma, eos=(eos,))
            assert result.token_ids == reference, (method, gamma)
        off = run(models, ids, "viasd", gamma, eos=(eos,), tau_accept=OFF, tau_slim=OFF)
        assert off.token_ids == reference


@pytest.mark.parametrize("arch", OTHER_ARCHS)
def test_other_layouts_route_and_stay_lossless(model_sets, tokenizer, arch):
    """Mistral, Qwen3, Gemma2 (sliding window 8, shorter than the sequence), Phi-3 and OPT."""
    models = model_sets(arch)
    ids = tokenizer(PROMPTS[1])["input_ids"]
    reference = hf_greedy(models, ids, N_NEW, None)
    assert run(models, ids, "ar", 1).token_ids == reference
    for method in ("sd", "cascade_sd"):
        assert run(models, ids, method, 4).token_ids == reference, method
    assert run(models, ids, "viasd", 4, tau_accept=OFF, tau_slim=OFF).token_ids == reference
    lossy = run(models, ids, "viasd", 4, tau_accept=1.0, tau_slim=0.3)
    assert len(lossy.token_ids) == N_NEW


def test_stop_string_cuts_like_the_reference(model_sets, tokenizer):
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    full = run(models, ids, "ar", 1)
    text = full.text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop
    for method in ("ar", "sd", "cascade_sd"):
        cut = run(models, ids, method, 4, stop_strings=(stop,))
        assert stop in cut.text
        assert cut.text.index(stop) + len(stop) <= len(cut.text)
        assert full.token_ids[: len(cut.token_ids)] == cut.token_ids
        # the last token completes the stop string: without it the text has none
        assert stop not in tokenizer.decode(cut.token_ids[:-1])


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2", "gemma2"])
def test_every_cache_kind_gives_the_same_tokens(model_sets, tokenizer, arch):
    """The KV cache kind (policy.cache) is a speed option only: `inplace` (the default, buffers written in
    place), `dynamic` (transformers' DynamicCache) and `static` (StaticCache) give the same tokens and
    passes, rollbacks included (overwritten in place). Gemma2 mixes sliding-window layers (kept as
    transformers' own) with full ones (in place); StaticCache refuses it (test below)."""
    models = model_sets(arch)
    ids = tokenizer(PROMPTS[1])["input_ids"]
    reference = hf_greedy(models, ids, N_NEW, None)
    kinds = ("dynamic",) if arch == "gemma2" else ("dynamic", "static")
    for method, kw in (("ar", {}), ("sd", {}), ("cascade_sd", {}), ("viasd", {"tau_accept": 1.2, "tau_slim": 0.5}),
                       ("spec_cascade", {})):
        inplace = run(models, ids, method, 3, cache="inplace", **kw)
        for kind in kinds:
            other = run(models, ids, method, 3, cache=kind, **kw)
            assert other.token_ids == inplace.token_ids, (method, kind)
            assert other.stats.passes == inplace.stats.passes, (method, kind)
        if method in ("ar", "sd", "cascade_sd"):
            assert inplace.token_ids == reference, method


def test_compiled_models_give_the_same_tokens(model_sets, tokenizer):
    """policy.compile (torch.compile, dynamic shapes) is a speed option only: the same greedy tokens and
    passes as eager for ar, sd and viasd (prefill, single steps, verification blocks, rollbacks)."""
    models = model_sets("llama")
    ids = tokenizer(PROMPTS[1])["input_ids"]
    for method, kw in (("ar", {}), ("sd", {}), ("viasd", {"tau_accept": 1.2, "tau_slim": 0.5})):
        for prompt in (ids, tokenizer(PROMPTS[0])["input_ids"]):  # another prompt length: dynamic shapes
            eager, fast = run(models, prompt, method, 3, **kw), run(models, prompt, method, 3, compile=True, **kw)
            assert fast.token_ids == eager.token_ids, method
            assert fast.stats.passes == eager.stats.passes, method


def test_static_cache_refuses_sliding_windows(model_sets, tokenizer):
    from viasd.errors import PolicyError

    with pytest.raises(PolicyError, match="does not support sliding-window"):
        run(model_sets("gemma2"), tokenizer(PROMPTS[0])["input_ids"], "sd", 3, cache="static")
