"""A model's generation config is honoured as `transformers.generate` honours it.

Checkpoints ship per-token settings (forced BOS/EOS, minimum lengths, suppressed and banned tokens, no
repeated n-grams, a repetition penalty). Saved with tiny random models of the T5, BART, Pegasus and
Marian layouts and of decoder-only layouts, as real checkpoints of each carry them, greedy `ar`, `sd`,
`cascade_sd` and tiers-off `viasd` must equal `generate(do_sample=False, num_beams=1)` with the model's
own generation config; sampled `sd` must keep the processed target's distribution; the fidelity is
measured against the processed target; a checkpoint default that is not a per-token choice gives one
clear line."""

import copy
import logging

import pytest
import torch
import transformers as tf
from conftest import PROMPTS
from test_distribution import ALPHA, WARP, p_value
from test_seq2seq import build_seq2seq_pair
from test_stats import check_accounting

from viasd import DecodePolicy, load_models
from viasd.decoding.processors import ProcessorSettings, RowProcessor, build
from viasd.decoding.sampling import Sampler
from viasd.errors import PolicyError

OFF = float("inf")
N_NEW = 20
# what checkpoints of each layout ship (token ids adapted to the tiny shared tokenizer; EOS is id 0)
SEQ2SEQ = {
    # summarisation BART (bart-large-cnn): forced BOS and EOS, no repeated trigrams, a minimum length, beams
    "bart": dict(forced_bos_token_id=5, forced_eos_token_id=0, no_repeat_ngram_size=3, min_length=8, num_beams=4,
                 length_penalty=2.0),
    # Pegasus: forced EOS at the last position, beams
    "pegasus": dict(forced_eos_token_id=0, num_beams=8, length_penalty=0.6),
    # Marian (opus-mt): the pad token never generated, forced EOS, beams
    "marian": dict(bad_words_ids=[[1]], forced_eos_token_id=0, num_beams=4),
    # Whisper-style suppressed tokens, and a repetition penalty
    "t5": dict(suppress_tokens=[3, 4, 9], begin_suppress_tokens=[7, 8], repetition_penalty=1.3),
}
DECODER_ONLY = {
    "llama": dict(repetition_penalty=1.5, no_repeat_ngram_size=2, min_new_tokens=10),
    "qwen2": dict(no_repeat_ngram_size=3, bad_words_ids=[[7], [8, 9]], repetition_penalty=1.2),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tokenizer, pair_dirs):
    """layout -> ModelSet of a pair saved with the layout's generation config (slim: decoder layers 0, 2)."""
    root = tmp_path_factory.mktemp("generation-config")
    loaded = {}

    def get(layout):
        if layout not in loaded:
            if layout in SEQ2SEQ:
                target, draft = build_seq2seq_pair(root, layout, tokenizer, generation=SEQ2SEQ[layout],
                                                   pad=1 if layout == "marian" else None)
            else:
                target, draft = root / f"{layout}-target", pair_dirs(layout)[1]
                model = tf.AutoModelForCausalLM.from_pretrained(pair_dirs(layout)[0])
                model.generation_config = with_settings(model.generation_config, DECODER_ONLY[layout])
                model.save_pretrained(target)
                tokenizer.save_pretrained(target)
            loaded[layout] = load_models(target, draft=draft, masks=[[0, 2]], device="cpu", dtype="float32")
        return loaded[layout]

    return get


def with_settings(config: tf.GenerationConfig, settings: dict) -> tf.GenerationConfig:
    """A checkpoint's generation config: the special tokens of `config` and `settings`."""
    special = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
    return tf.GenerationConfig(**{k: getattr(config, k) for k in special if getattr(config, k, None) is not None},
                               **settings)


def hf_greedy(models, ids, n):
    """`generate` with the model's own generation config, one greedy sequence."""
    out = models.target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, num_beams=1, max_new_tokens=n)
    start = 1 if models.target.config.is_encoder_decoder else len(ids)
    return out[0, start:].tolist()


def run(models, ids, method, gamma=4, **kw):
    return models.generate(ids, DecodePolicy(method=method, gamma=gamma, max_new_tokens=N_NEW, **kw))


@pytest.mark.parametrize("layout", [*SEQ2SEQ, *DECODER_ONLY])
def test_greedy_methods_equal_generate_with_the_models_generation_config(checkpoints, tokenizer, layout):
    models = checkpoints(layout)
    changed = False
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        reference = hf_greedy(models, ids, N_NEW)
        ar = run(models, ids, "ar")
        assert ar.token_ids == reference, (layout, prompt)
        check_accounting(ar.stats)
        for gamma in (1, 3, 5):
            for method, kw in (("sd", {}), ("cascade_sd", {}), ("viasd", dict(tau_accept=OFF, tau_slim=OFF))):
                out = run(models, ids, method, gamma, **kw)
                assert out.token_ids == reference, (layout, prompt, method, gamma)
                check_accounting(out.stats)
        raw = run(models, ids, "ar", generation_config=False)
        changed |= raw.token_ids != reference
        # the fidelity is measured against the target as the decode processed it
        scores, _ = models.score([ids], [ar.token_ids], DecodePolicy(max_new_tokens=N_NEW))
        assert scores["fidelity"] == 1.0
    assert changed  # the settings decide something on these prompts: the test is not vacuous


def test_a_checkpoint_default_that_is_not_a_per_token_choice_gives_one_line(checkpoints, tokenizer, caplog):
    models = checkpoints("pegasus")
    ids = tokenizer(PROMPTS[1])["input_ids"]
    models.target.generation_config = copy.deepcopy(models.target.generation_config)  # a config not reported yet
    with caplog.at_level(logging.WARNING, logger="viasd.decoding.processors"):
        for _ in range(3):
            run(models, ids, "sd")
    lines = [r.getMessage() for r in caplog.records if "not a per-token choice" in r.getMessage()]
    assert len(lines) == 1 and "num_beams=8" in lines[0] and "num_beams=1" in lines[0]


def test_overrides_and_raw_logits(checkpoints, tokenizer):
    """`generation` settings go over the checkpoint's; `generation_config=False` decodes raw logits (then
    the settings given alone apply)."""
    models = checkpoints("llama")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    one = run(models, ids, "ar", generation={"no_repeat_ngram_size": 1})
    assert len(set(one.token_ids)) == len(one.token_ids) and not set(one.token_ids) & set(ids)
    raw = run(models, ids, "ar", generation_config=False)
    plain = models.target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                   do_sample=False, num_beams=1, max_new_tokens=N_NEW, repetition_penalty=1.0,
                                   no_repeat_ngram_size=0, min_new_tokens=0)
    assert raw.token_ids == plain[0, len(ids):].tolist()
    with pytest.raises(PolicyError, match="unknown generation setting num_beams"):
        DecodePolicy(generation={"num_beams": 4})
    with pytest.raises(PolicyError, match="repetition_penalty must be > 0"):
        DecodePolicy(generation={"repetition_penalty": 0})


def test_each_row_is_processed_with_its_own_prefix():
    """A verification pass returns the rows of several positions: row r sees the prefix up to position
    upto - n + r, as `generate` would at that step."""
    seen = []

    def record(input_ids, scores):
        seen.append(input_ids[0].tolist())
        return scores + input_ids.shape[-1]

    ids = torch.tensor([[10, 11, 12, 13, 14, 15, 0, 0]])
    out = RowProcessor(tf.generation.LogitsProcessorList([record]))(ids, 6, torch.zeros(3, 4))
    assert seen == [[10, 11, 12, 13], [10, 11, 12, 13, 14], [10, 11, 12, 13, 14, 15]]
    assert out[:, 0].tolist() == [4.0, 5.0, 6.0]
    # generate's forced EOS lands on the last of max_new_tokens after a decoder-side prompt of 3
    procs = build(ProcessorSettings(forced_eos_token_id=2), 3, 5, [2], torch.device("cpu"))
    logits = procs(torch.arange(8)[None], 7, torch.zeros(2, 6))  # rows after prefixes of 6 and 7 tokens
    assert logits[0].isfinite().all() and logits[1].argmax() == 2 and logits[1].isinf().sum() == 5
    assert build(ProcessorSettings(), 3, 5, [2], torch.device("cpu")) is None  # nothing set: raw logits


def test_sampled_sd_keeps_the_processed_targets_distribution(model_sets, tokenizer):
    """With `no_repeat_ngram_size: 1` (no token of the prefix again; the expected distribution built by
    hand, not with transformers' processor) the first two sampled tokens of `sd` and `cascade_sd` follow
    the processed, warped target (chi-square as in test_distribution.py)."""
    from viasd.decoding.engine import decode

    models = model_sets("llama")
    ids = tokenizer(PROMPTS[0])["input_ids"]
    warp = Sampler(WARP, torch.device("cpu"), 0).probs

    def banned(logits, prefix):
        logits = logits.clone()
        logits[list(set(prefix))] = float("-inf")
        return warp(logits)

    dist = {}
    with torch.inference_mode():
        first = banned(models.target(torch.tensor([ids])).logits[0, -1, : models.vocab_size].float(), ids)
        for t1 in torch.nonzero(first).flatten().tolist():
            logits = models.target(torch.tensor([ids + [t1]])).logits[0, -1, : models.vocab_size].float()
            second = banned(logits, ids + [t1])
            for t2 in torch.nonzero(second).flatten().tolist():
                dist[(t1, t2)] = float(first[t1] * second[t2])
    for method in ("sd", "cascade_sd"):
        counts = {}
        for seed in range(1200):
            policy = DecodePolicy(method=method, gamma=2, max_new_tokens=2, sampling=WARP, seed=seed, eos_token_ids=(),
                                  generation={"no_repeat_ngram_size": 1})
            key = tuple(decode(ids, policy, models.target, models.vocab_size, draft=models.draft,
                               slims=models.slims).token_ids[:2])
            counts[key] = counts.get(key, 0) + 1
        assert all(cell in dist for cell in counts), method  # never a banned token
        assert p_value(counts, dist) > ALPHA, method


@pytest.mark.parametrize("layout", list(DECODER_ONLY))
def test_batched_rows_take_the_models_generation_config_each_with_its_own_prefix(checkpoints, tokenizer, layout):
    """A batch of the prompts decodes each row under the checkpoint's generation config (repetition penalty,
    banned n-grams, a minimum length) as `generate` does that prompt alone; the stats' identities hold per row."""
    models = checkpoints(layout)
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    reference = [hf_greedy(models, i, N_NEW) for i in ids]
    for method, kw in (("ar", {}), ("sd", {}), ("viasd", dict(tau_accept=OFF, tau_slim=OFF))):
        out = models.generate(ids, DecodePolicy(method=method, gamma=3, max_new_tokens=N_NEW, **kw), batch_size=2)
        assert [r.token_ids for r in out] == reference, method
        for r in out:
            check_accounting(r.stats)
