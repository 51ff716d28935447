"""A draft with another tokenizer than the target's: its proposals are carried into the target's tokens
through text (decoding/text_draft.py, as transformers' universal assisted generation does), and the
output is the target's: greedy identical to `ar` and to `generate`, sampled with the target's
distribution. Tested with a Llama-layout draft on one tokenizer and a Qwen2-layout target on another,
and with a draft that is the target itself in another vocabulary (whose proposals must then be
accepted: the text carries them intact)."""

import json

import pytest
import torch
import transformers as tf
from conftest import PROMPTS
from test_distribution import ALPHA, WARP, p_value
from test_stats import check_accounting
from tiny_models import build_model, build_tokenizer

from viasd import DecodePolicy, load_models
from viasd.decoding.sampling import Sampler
from viasd.errors import BenchError, PolicyError

OFF = float("inf")
N_NEW = 24


def permuted_tokenizer(path, vocab_size: int):
    """A BPE tokenizer whose ids 50..149 are in reverse order (the same tokens, other ids); its permutation."""
    tok = build_tokenizer(path, vocab_size=vocab_size)
    data = json.loads((path / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    for token, i in list(vocab.items()):
        if 50 <= i < 150:
            vocab[token] = 199 - i
    (path / "tokenizer.json").write_text(json.dumps(data))
    perm = torch.arange(len(tok))
    perm[50:150] = torch.arange(149, 49, -1)
    return tf.AutoTokenizer.from_pretrained(path), perm


@pytest.fixture(scope="module")
def pairs(tmp_path_factory, tokenizer, pair_dirs):
    """`other`: a Qwen2 target on the shared test tokenizer and a Llama draft on its own (more merges,
    other ids); `mirror`: the Llama test target and itself with its vocabulary permuted as its draft."""
    root = tmp_path_factory.mktemp("cross-tokenizer")
    target = build_model(root / "qwen2-target", "qwen2", 4, 0, tokenizer, scale=25.0)
    draft_tok, _ = permuted_tokenizer(root / "draft-tok", 300)
    draft = build_model(root / "llama-draft", "llama", 1, 1, draft_tok, scale=25.0)
    other = load_models(target, draft=draft, masks=[[0, 2]], device="cpu", dtype="float32")

    llama_target = pair_dirs("llama")[0]
    mirror_tok, perm = permuted_tokenizer(root / "mirror-tok", len(tokenizer))
    model = tf.AutoModelForCausalLM.from_pretrained(llama_target)
    with torch.no_grad():  # token perm[i] of the mirror is token i of the target (perm is its own inverse)
        for layer in (model.get_input_embeddings(), model.get_output_embeddings()):
            layer.weight.copy_(layer.weight[perm])
    model.save_pretrained(root / "mirror")
    mirror_tok.save_pretrained(root / "mirror")
    mirror = load_models(llama_target, draft=root / "mirror", masks=[[0, 2]], device="cpu", dtype="float32")
    return {"other": other, "mirror": mirror}


def hf_greedy(models, ids, n):
    out = models.target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, num_beams=1, max_new_tokens=n, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def run(models, ids, method, gamma=4, **kw):
    return models.generate(ids, DecodePolicy(method=method, gamma=gamma, max_new_tokens=N_NEW, eos_token_ids=(), **kw))


@pytest.mark.parametrize("pair", ["other", "mirror"])
def test_greedy_output_is_the_targets(pairs, tokenizer, pair):
    models = pairs[pair]
    assert models.cross_vocab and models.vocab_size == len(tokenizer)
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        ar = run(models, ids, "ar")
        assert ar.token_ids == hf_greedy(models, ids, N_NEW), (pair, prompt)
        for gamma in (1, 3, 5):
            for method, kw in (("sd", {}), ("viasd", dict(tau_accept=OFF, tau_slim=OFF))):
                out = run(models, ids, method, gamma, **kw)
                assert out.token_ids == ar.token_ids, (pair, prompt, method, gamma)
                check_accounting(out.stats)
                assert out.stats.drafted > 0 and out.stats.draft_own_tokens > 0
        tiered = run(models, ids, "viasd", tau_accept=1.0, tau_slim=0.3)
        check_accounting(tiered.stats)
        assert len(tiered.token_ids) == N_NEW


def mirror(target_dir, tokenizer_dir, out):
    """`target_dir`'s model with its vocabulary permuted (`permuted_tokenizer` of the tokenizer saved in
    `tokenizer_dir`'s tokenizer.json): the same model in another vocabulary."""
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    n = len(vocab)
    for token, i in list(vocab.items()):
        if 50 <= i < 150:
            vocab[token] = 199 - i
    model = tf.AutoModelForCausalLM.from_pretrained(target_dir)
    perm = torch.arange(model.get_output_embeddings().weight.shape[0])
    perm[50:150] = torch.arange(149, 49, -1)
    with torch.no_grad():
        for layer in {id(x): x for x in (model.get_input_embeddings(), model.get_output_embeddings())}.values():
            layer.weight.copy_(layer.weight[perm])
    model.save_pretrained(out)
    tf.AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    (out / "tokenizer.json").write_text(json.dumps(data))
    assert n > 150
    return out


def test_the_target_in_another_vocabulary(study, tmp_path):
    """The trained smoke target, and as its draft the same model in another vocabulary: output equal to
    `ar`, and proposals accepted (the text carried them intact). Not nearly all: a model may write text
    in other tokens than its tokenizer's own encoding of that text (this one writes runs of spaces one
    space at a time, which the tokenizer encodes as one token), and carried through text a proposal
    arrives in the tokenizer's encoding."""
    from viasd.tasks import load_examples

    _, params = study
    target = params.model_dir("target")
    models = load_models(target, draft=mirror(target, target, tmp_path / "mirror"), device="cpu", dtype="float32")
    assert models.cross_vocab
    prompts = [models.encode(e.prompt) for e in load_examples(params.data.dir, "stdlib_continuation", "test")[:3]]
    accepted = 0
    for ids in prompts:
        out = run(models, ids, "sd")
        assert out.token_ids == run(models, ids, "ar").token_ids
        accepted += out.stats.accepted_full
    assert accepted > 0


def test_the_study_takes_such_a_pair_as_a_hub_pair(study, tmp_path):
    """A hub pair whose draft has another tokenizer decodes in the study's decode stage: `sd` writes
    `ar`'s tokens and counts the draft's own tokens; a run that needs the draft's distribution is
    refused with one clear error."""
    from study_fixtures import smoke_params

    from viasd import config
    from viasd.stages.decode import run_decode_stage

    src, params = study
    target = params.model_dir("target")
    draft = mirror(target, target, tmp_path / "mirror")
    overrides = {"models": {"hub_pairs": {"mixed": {"target": str(target), "draft": str(draft)}}},
                 "data": {"dir": str(params.data.dir)}, "study": {"reports": str(tmp_path / "reports")},
                 "decode": {"sd_gamma": 3}}  # no threshold search for this pair: sd at a fixed gamma
    hub = config.load(smoke_params(tmp_path, overrides))
    ar, sd = run_decode_stage(hub, "mixed", "stdlib_continuation", ["ar", "sd"], limit=2, progress=False)
    assert sd["fidelity"] == 1.0 and sd["draft_own_tokens"] > 0 and sd["drafted"] > 0
    assert sd["new_tokens"] == ar["new_tokens"]
    with pytest.raises(PolicyError, match="another tokenizer"):
        run_decode_stage(hub, "mixed", "stdlib_continuation", ["spec_cascade"], limit=1, progress=False)


def test_text_survives_the_trip_between_tokenizers(tokenizer, tmp_path):
    """What a block's proposals carry: the draft's new text, decoded in the context of its last tokens,
    and encoded after the target's last tokens, so the target's text grows by exactly that text (a word
    continued across the boundary included)."""
    from tiny_models import TEXT

    from viasd.decoding.text_draft import TAIL, _text_after, _tokens_after

    draft_tok, _ = permuted_tokenizer(tmp_path / "draft-tok", 300)
    lines = [line for line in TEXT.splitlines() if len(line) > 30][:40]
    for line in lines:
        cut = len(line) // 2
        committed = tokenizer(line[:cut], add_special_tokens=False)["input_ids"]
        draft_seq = draft_tok(line, add_special_tokens=False)["input_ids"]
        start = len(draft_tok(line[:cut], add_special_tokens=False)["input_ids"])
        text = _text_after(draft_tok, draft_seq[max(0, start - TAIL) : start], draft_seq[start:])
        assert draft_tok.decode(draft_seq[:start]) + text == line
        proposals = _tokens_after(tokenizer, committed[-TAIL:], text)
        assert tokenizer.decode(committed + proposals) == tokenizer.decode(committed) + text, line


def test_sampled_sd_has_the_targets_distribution(pairs, tokenizer):
    """Each proposal is a point mass for the acceptance test; the first two sampled tokens follow the
    warped target (chi-square as in test_distribution.py)."""
    from viasd.decoding.engine import decode

    models = pairs["mirror"]
    ids = tokenizer(PROMPTS[0])["input_ids"]
    warp = Sampler(WARP, torch.device("cpu"), 0).probs
    dist = {}
    with torch.inference_mode():
        first = warp(models.target(torch.tensor([ids])).logits[0, -1, : models.vocab_size].float())
        for t1 in torch.nonzero(first).flatten().tolist():
            second = warp(models.target(torch.tensor([ids + [t1]])).logits[0, -1, : models.vocab_size].float())
            for t2 in torch.nonzero(second).flatten().tolist():
                dist[(t1, t2)] = float(first[t1] * second[t2])
    counts, accepted = {}, 0
    for seed in range(1200):
        policy = DecodePolicy(method="sd", gamma=2, max_new_tokens=2, sampling=WARP, seed=seed, eos_token_ids=())
        out = decode(ids, policy, models.target, models.vocab_size, draft=models.draft, tokenizer=models.tokenizer,
                     draft_tokenizer=models.draft_tokenizer)
        key = tuple(out.token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
        accepted += out.stats.accepted_full
    assert accepted > 0  # proposals were tested, not only bonus tokens drawn
    assert p_value(counts, dist) > ALPHA


def test_methods_that_need_the_drafts_distribution_are_refused(pairs, tokenizer):
    models = pairs["other"]
    ids = tokenizer(PROMPTS[0])["input_ids"]
    for method in ("cascade_sd", "spec_cascade"):
        with pytest.raises(PolicyError, match="another tokenizer than the target's runs sd and viasd"):
            run(models, ids, method)


def test_bench_compares_with_universal_assisted_generation(pairs, tokenizer):
    """`viasd bench` on the pair: transformers' assisted generation gets both tokenizers (universal
    assisted generation), and every lossless method writes the same tokens."""
    from viasd.bench.methods import method_table
    from viasd.bench.timing import run_benchmark

    models = pairs["other"]  # transformers tells the tokenizers apart by their sizes (256 and 300)
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS[:2]]
    names = ["hf_ar", "hf_assisted", "ar", "sd", "viasd"]
    res = run_benchmark(models, prompts, method_table(models, names, 3, 8), 8, repeats=1, progress=False)
    assert set(res["methods"]) == set(names)
    assert res["methods"]["sd"]["quality"]["fidelity"] == 1.0 and res["ratios"]["sd_vs_hf_assisted"] > 0
    with pytest.raises(BenchError, match="as many tokens"):  # the mirror: another tokenizer of the same size
        run_benchmark(pairs["mirror"], prompts, method_table(pairs["mirror"], ["hf_assisted"], 3, 8), 8, repeats=1,
                      progress=False)
