"""Encoder-decoder pairs (T5 and BART layouts, tiny random models saved and loaded like a user's):
the prompt is encoded once per model, every method decodes, the greedy invariants hold against
`transformers`, the routed slim verifier selects from the decoder stack, and sampled `sd` has the
target's distribution."""

import re

import pytest
import torch
import transformers as tf
from conftest import PROMPTS
from test_distribution import ALPHA, WARP, p_value
from test_stats import check_accounting
from transformers.cache_utils import DummyLayer

from viasd import DecodePolicy, load_models
from viasd.decoding.kv_cache import cache_parts
from viasd.decoding.sampling import Sampler
from viasd.decoding.slim import RoutingMask, SlimVerifier, find_layer_stack, num_decoder_layers, shares_storage
from viasd.errors import PolicyError

LAYOUTS = ["t5", "bart"]
N_NEW = 20
OFF = float("inf")


def seq2seq_config(layout: str, decoder_layers: int, vocab: int, eos: int, pad: int | None = None):
    """A tiny config of `layout` (t5, bart, pegasus, marian); `pad`: a pad (and decoder start) token other
    than EOS, as Marian checkpoints have."""
    pad = eos if pad is None else pad
    common = dict(vocab_size=vocab, pad_token_id=pad, eos_token_id=eos, decoder_start_token_id=pad)
    if layout == "t5":
        # as deep an encoder as the decoder: transformers' generate sizes a T5 cache by the encoder's depth
        return tf.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=decoder_layers, num_decoder_layers=decoder_layers,
                           num_heads=4, **common)
    bart_like = dict(d_model=64, encoder_layers=2, decoder_layers=decoder_layers, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=512,
                     tie_word_embeddings=False, **common)
    if layout == "pegasus":
        return tf.PegasusConfig(**bart_like)
    if layout == "marian":
        return tf.MarianConfig(share_encoder_decoder_embeddings=True, **bart_like)
    return tf.BartConfig(bos_token_id=eos, forced_bos_token_id=None, forced_eos_token_id=None, **bart_like)


def _sharpen(model, layout: str) -> None:
    """Peakier output distributions (a random model's are nearly flat, so greedy ties would be common).
    T5 ties its head to its embeddings, whose size also sets how much the input token dominates the
    residual stream (too large: the model copies its input forever): smaller embeddings, a larger
    final norm. BART: a larger head."""
    with torch.no_grad():
        if layout == "t5":
            model.shared.weight.mul_(0.3)
            model.decoder.final_layer_norm.weight.mul_(15.0)
        else:
            model.get_output_embeddings().weight.mul_(25.0)


def build_seq2seq_pair(root, layout, tokenizer, layers=4, seed=0, noise=0.3, damping=0.5, generation=None, pad=None):
    """A random encoder-decoder target (its decoder layers after the first damped, its output sharpened)
    and a one-decoder-layer draft made of the target's encoder, embeddings, first decoder layer, final
    norm and head with noise on its decoder: acceptance is neither 0 nor 1. `generation`: fields of the
    generation config saved with both, as a checkpoint ships them."""
    torch.manual_seed(seed)
    eos = tokenizer.eos_token_id
    target = tf.AutoModelForSeq2SeqLM.from_config(seq2seq_config(layout, layers, len(tokenizer), eos, pad))
    _sharpen(target, layout)
    with torch.no_grad():
        for name, param in target.named_parameters():
            index = re.search(r"decoder\.(?:block|layers)\.(\d+)\.", name)
            if index and int(index.group(1)) >= 1 and param.dim() == 2:
                param.mul_(damping)
    torch.manual_seed(seed + 1)
    draft = tf.AutoModelForSeq2SeqLM.from_config(seq2seq_config(layout, 1, len(tokenizer), eos, pad))
    draft.load_state_dict({k: v for k, v in target.state_dict().items() if k in draft.state_dict()}, strict=False)
    with torch.no_grad():
        for name, param in draft.named_parameters():
            if param.dim() == 2 and ("decoder.block" in name or "decoder.layers" in name):
                param.add_(noise * param.std() * torch.randn_like(param))
    dirs = []
    for role, model in (("target", target), ("draft", draft)):
        if generation:
            special = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
            model.generation_config = tf.GenerationConfig(
                **{k: getattr(model.config, k) for k in special if getattr(model.config, k, None) is not None}, **generation)
        path = root / f"{layout}-{role}"
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        dirs.append(path)
    return dirs


@pytest.fixture(scope="module")
def seq2seq(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("seq2seq")
    loaded = {}

    def get(layout):
        if layout not in loaded:
            target, draft = build_seq2seq_pair(root, layout, tokenizer)
            loaded[layout] = load_models(target, draft=draft, masks=[[0, 2]], device="cpu", dtype="float32")
        return loaded[layout]

    return get


def hf_greedy(models, ids, n):
    out = models.target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None)
    return out[0, 1:].tolist()  # the decoder start token first


def run(models, ids, method, gamma=4, **kw):
    return models.generate(ids, DecodePolicy(method=method, gamma=gamma, max_new_tokens=N_NEW, eos_token_ids=(), **kw))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_loads_as_encoder_decoder_and_routes_the_decoder_stack(seq2seq, layout):
    models = seq2seq(layout)
    assert models.target.config.is_encoder_decoder and models.draft.config.is_encoder_decoder
    assert num_decoder_layers(models.target) == 4  # the decoder's depth (BART's encoder has 2 layers)
    path = find_layer_stack(models.target)
    assert "decoder" in path and "encoder" not in path
    slim = models.slims[0]
    assert shares_storage(slim) and slim.model.get_encoder() is models.target.get_encoder()
    cache = slim.new_cache("dynamic")
    for part in cache_parts(cache):  # self- and cross-attention: real slots for the kept layers only
        assert [isinstance(layer, DummyLayer) for layer in part.layers] == [False, True, False, True]
    ids = torch.tensor([[5, 6, 7, 8]])
    start = torch.tensor([[models.target.config.decoder_start_token_id, 9, 10]])
    with torch.inference_mode():
        full = models.target(input_ids=ids, decoder_input_ids=start).logits
        every = SlimVerifier(models.target, RoutingMask.from_layers([0, 1, 2, 3], 4))
        assert torch.allclose(every.model(input_ids=ids, decoder_input_ids=start, cache=every.new_cache()).logits,
                              full, atol=1e-5)
        routed = slim.model(input_ids=ids, decoder_input_ids=start, cache=slim.new_cache()).logits
    assert not torch.allclose(routed, full, atol=1e-3)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_greedy_methods_equal_transformers(seq2seq, tokenizer, layout):
    models = seq2seq(layout)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        ar = run(models, ids, "ar")
        assert ar.token_ids == hf_greedy(models, ids, N_NEW), (layout, prompt)
        check_accounting(ar.stats)
        assert ar.stats.prompt_tokens == len(ids) and ar.stats.encoder_time_s > 0
        for gamma in (1, 3, 5):
            for method, kw in (("sd", {}), ("cascade_sd", {}), ("viasd", dict(tau_accept=OFF, tau_slim=OFF))):
                out = run(models, ids, method, gamma, **kw)
                assert out.token_ids == ar.token_ids, (layout, prompt, method, gamma)
                check_accounting(out.stats)
        sd = run(models, ids, "sd")
        assert 0 < sd.stats.acceptance_rate < 1  # the draft is neither the target nor unrelated to it
        for method, kw in (("viasd", dict(tau_accept=1.0, tau_slim=0.3)), ("spec_cascade", {})):
            out = run(models, ids, method, **kw)
            assert len(out.token_ids) == N_NEW
            check_accounting(out.stats)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_encoder_runs_once_per_prompt(seq2seq, tokenizer, layout):
    """The target's encoder serves the target and its routed slim; the draft encodes for itself. Counted
    with forward hooks on the encoders."""
    models = seq2seq(layout)
    calls = {"target": 0, "draft": 0}
    hooks = [models.target.get_encoder().register_forward_hook(lambda *_: calls.__setitem__("target", calls["target"] + 1)),
             models.draft.get_encoder().register_forward_hook(lambda *_: calls.__setitem__("draft", calls["draft"] + 1))]
    try:
        out = run(models, tokenizer(PROMPTS[0])["input_ids"], "viasd", tau_accept=3.0, tau_slim=0.99)
    finally:
        for h in hooks:
            h.remove()
    assert calls == {"target": 1, "draft": 1} and out.stats.passes["slim"] > 0 and out.stats.passes["target"] > 0


def test_static_cache_and_mixed_pairs_are_refused(seq2seq, tokenizer, model_sets):
    models = seq2seq("t5")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    with pytest.raises(PolicyError, match="not supported for encoder-decoder"):
        run(models, ids, "sd", cache="static")
    assert run(models, ids, "sd", cache="dynamic").token_ids == run(models, ids, "sd").token_ids  # inplace default
    from viasd.decoding.engine import decode

    causal = model_sets("llama")
    with pytest.raises(PolicyError, match="both be encoder-decoder"):
        decode(ids, DecodePolicy(method="sd", max_new_tokens=4), models.target, models.vocab_size, draft=causal.draft)


def test_sampled_sd_has_the_targets_distribution(seq2seq, tokenizer):
    """The first two sampled tokens of `sd` on the T5 pair against the warped target's exact distribution
    (chi-square, as for decoder-only pairs in test_distribution.py)."""
    from viasd.decoding.engine import decode

    models = seq2seq("t5")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    warp = Sampler(WARP, torch.device("cpu"), 0).probs
    start = models.target.config.decoder_start_token_id
    enc = torch.tensor([ids])
    dist = {}
    with torch.inference_mode():
        first = warp(models.target(input_ids=enc, decoder_input_ids=torch.tensor([[start]])).logits[0, -1].float())
        for t1 in torch.nonzero(first).flatten().tolist():
            second = warp(models.target(input_ids=enc, decoder_input_ids=torch.tensor([[start, t1]])).logits[0, -1].float())
            for t2 in torch.nonzero(second).flatten().tolist():
                dist[(t1, t2)] = float(first[t1] * second[t2])
    counts = {}
    for seed in range(1000):
        policy = DecodePolicy(method="sd", gamma=2, max_new_tokens=2, sampling=WARP, seed=seed, eos_token_ids=())
        key = tuple(decode(ids, policy, models.target, models.vocab_size, draft=models.draft).token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
    assert p_value(counts, dist) > ALPHA


def test_bench_runs_every_method_and_the_transformers_baselines(seq2seq, tokenizer):
    """`viasd bench`'s benchmark on the T5 pair: every method and transformers' greedy and assisted
    generation for seq2seq, with the same-output check of the lossless ones."""
    from viasd.bench.methods import method_table
    from viasd.bench.timing import run_benchmark

    models = seq2seq("t5")
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS[:2]]
    names = ["hf_ar", "hf_assisted", "hf_assisted_fixed", "ar", "sd", "cascade_sd", "spec_cascade", "viasd",
             "viasd-oracle", "viasd-oracle_budget"]
    res = run_benchmark(models, prompts, method_table(models, names, 3, 8, oracle_budget=0.5), 8, repeats=1,
                        progress=False)
    assert set(res["methods"]) == set(names)
    assert all(res["methods"][n]["tokens_per_second"]["median"] > 0 for n in names)
    assert res["methods"]["sd"]["quality"]["fidelity"] == 1.0 and res["ratios"]["sd_vs_hf_assisted"] > 0
    # the oracles on an encoder-decoder pair: the plain one is the target's greedy output, the budgeted one
    # within its budget; each timed without its peeks
    assert res["methods"]["viasd-oracle"]["quality"]["fidelity"] == 1.0
    assert res["methods"]["viasd-oracle_budget"]["quality"]["fidelity"] >= 0.5
    assert {"viasd-oracle_vs_sd", "viasd-oracle_budget_vs_sd"} <= set(res["ratios"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dimr_searches_the_decoder_on_split_windows(seq2seq, tokenizer, tmp_path, layout):
    """DIMR on an encoder-decoder pair: each calibration window's first half is the source, the rest the
    target; the all-layers slim costs nothing against the target, a routed one does, and the search
    returns a mask of the budget over the decoder's layers."""
    from viasd.search.calibration_set import greedy_choices, window_logits
    from viasd.search.dimr import DimrConfig, MaskCost, dimr_search

    models = seq2seq(layout)
    windows = torch.tensor([tokenizer(p * 6)["input_ids"][:17] for p in PROMPTS])
    every, half = RoutingMask.from_layers([0, 1, 2, 3], 4), RoutingMask.from_layers([0, 2], 4)
    target_cost = MaskCost(models.target, models.draft, windows, models.vocab_size, "target", 2)
    assert target_cost(every) == pytest.approx(0.0, abs=1e-5) and target_cost(half) > 0
    assert target_cost.target_logp.shape[:2] == (3, 17 - 17 // 2)  # the target half of each window
    path = MaskCost(models.target, models.draft, windows, models.vocab_size, "path", 2)
    result = dimr_search(path, DimrConfig(n_random=3, n_bayes=2), f"sqlite:///{tmp_path / 'dimr.db'}", "dimr", False)
    assert len(result.keep_layers) == 2 and all(0 <= k < 4 for k in result.keep_layers) and result.cost > 0
    choices, nll = greedy_choices(lambda ids: window_logits(models.target, ids), windows, models.vocab_size,
                                  encoder_decoder=True)
    assert choices.shape == (3, 17 - 17 // 2) and nll > 0


def _shallow_encoder(models, layout, depth):
    """The target with an encoder of `depth` layers, built as transformers builds one and loaded with the
    target's weights (its first `depth` encoder layers): what a slim keeping encoder layers 0..depth-1 runs."""
    config = models.target.config.to_dict()
    config["num_layers" if layout == "t5" else "encoder_layers"] = depth
    small = tf.AutoModelForSeq2SeqLM.from_config(type(models.target.config).from_dict(config)).eval()
    missing, _ = small.load_state_dict(models.target.state_dict(), strict=False)
    assert not missing
    return small


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_slim_can_skip_encoder_layers(seq2seq, tokenizer, tmp_path, layout):
    """The measured option: a mask that also names encoder layers gives the slim an encoder of its own (a
    view running those layers; the target's is untouched), equal to a shallower model built from the
    target's weights. Lossless methods stay lossless with it; the mask file carries it."""
    import json

    from viasd.decoding.slim import find_encoder_stack, num_encoder_layers
    from viasd.errors import MaskError

    models = seq2seq(layout)
    target = models.target
    n_enc = num_encoder_layers(target)
    assert n_enc == (4 if layout == "t5" else 2) and "encoder" in find_encoder_stack(target)
    mask = RoutingMask.from_layers([0, 2], 4).with_encoder([0], n_enc)
    slim = SlimVerifier(target, mask)
    assert shares_storage(slim) and slim.model.get_encoder() is not target.get_encoder()
    assert len(target.get_encoder().get_submodule(find_encoder_stack(target)[-1])) == n_enc  # untouched
    ids = torch.tensor([tokenizer(PROMPTS[1])["input_ids"]])
    with torch.inference_mode():
        ours = slim.model.get_encoder()(input_ids=ids).last_hidden_state
        theirs = _shallow_encoder(models, layout, 1).get_encoder()(input_ids=ids).last_hidden_state
        full = target.get_encoder()(input_ids=ids).last_hidden_state
    assert torch.allclose(ours, theirs, atol=1e-5) and not torch.allclose(ours, full, atol=1e-3)
    # every encoder layer kept is the shared encoder; layer 0 must stay (T5's position bias)
    assert RoutingMask.from_layers([0, 2], 4).with_encoder(list(range(n_enc)), n_enc).encoder_keep_layers is None
    with pytest.raises(MaskError, match="must include layer 0"):
        RoutingMask.from_layers([0, 2], 4).with_encoder([1], n_enc)
    path = tmp_path / "mask.json"
    path.write_text(json.dumps({"keep_layers": [0, 2], "encoder_keep_layers": [0], "encoder_num_layers": n_enc}))
    assert RoutingMask.from_json(path, 4) == mask
    path.write_text(json.dumps({"keep_layers": [0, 2], "encoder_keep_layers": [0], "encoder_num_layers": n_enc + 1}))
    with pytest.raises(MaskError, match=f"made for {n_enc + 1} encoder layers"):
        SlimVerifier(target, RoutingMask.from_json(path, 4))
    # decoding with it: greedy sd / cascade_sd still equal ar, viasd uses the slim
    from viasd.models import ModelSet

    skipping = ModelSet(target, models.tokenizer, models.draft, [slim], models.draft_tokenizer)
    prompt = tokenizer(PROMPTS[0])["input_ids"]
    ar = run(skipping, prompt, "ar")
    assert run(skipping, prompt, "cascade_sd").token_ids == run(skipping, prompt, "sd").token_ids == ar.token_ids
    out = run(skipping, prompt, "viasd", tau_accept=3.0, tau_slim=0.5)
    assert out.stats.passes["slim"] > 0
    check_accounting(out.stats)


def test_an_encoder_mask_is_refused_for_a_decoder_only_target(model_sets):
    from viasd.errors import UnsupportedArchitectureError

    causal = model_sets("llama")
    mask = RoutingMask.from_layers([0], num_decoder_layers(causal.target)).with_encoder([0], 2)
    with pytest.raises(UnsupportedArchitectureError, match="only an encoder-decoder target's slim can skip encoder"):
        SlimVerifier(causal.target, mask)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dimr_with_encoder_layers_skipped_measures_both_costs(seq2seq, tokenizer, tmp_path, layout):
    """`dimr.encoder_keep_ratio`: every costed slim runs the first encoder layers only; the cost of the
    same decoder mask with the target's whole encoder stays measurable (`exact`)."""
    from viasd.search.dimr import DimrConfig, MaskCost

    models = seq2seq(layout)
    windows = torch.tensor([tokenizer(p * 6)["input_ids"][:17] for p in PROMPTS])
    keep = DimrConfig(encoder_keep_ratio=0.5).encoder_keep(models.target)
    assert keep == ((0, 1) if layout == "t5" else (0,))
    assert DimrConfig().encoder_keep(models.target) is None
    cost = MaskCost(models.target, models.draft, windows, models.vocab_size, "target", 2, encoder_keep=keep)
    every = RoutingMask.from_layers([0, 1, 2, 3], 4)
    assert cost.exact(every) == pytest.approx(0.0, abs=1e-5)  # the whole target
    skipped = cost(every)  # the same decoder with half the encoder: not the target
    assert set(cost._seen) == {((0, 1, 2, 3), None), ((0, 1, 2, 3), keep)} and skipped > cost.exact(every)
    if layout == "t5":  # (the tiny BART's decoder reads its encoder only faintly)
        assert skipped > 1e-4
