"""VIA-SD from transformers' `generate` (`viasd.hf`): a callable and the repository's `custom_generate/` folder, on
tiny real models, against `generate(do_sample=False)` itself."""

from __future__ import annotations

import math

import pytest
import torch
import transformers as tf
from tiny_models import build_pair, build_tokenizer

import viasd.hf
from viasd import DecodePolicy
from viasd.errors import PolicyError

REPO = __import__("pathlib").Path(__file__).resolve().parent.parent
OFF = DecodePolicy(method="viasd", gamma=3, tau_accept=math.inf, tau_slim=math.inf)  # every tier off: plain SD


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"hf-{request.param}")
    tok = build_tokenizer(root / "tok")
    target_dir, draft_dir = build_pair(root, request.param, tok)
    target = tf.AutoModelForCausalLM.from_pretrained(target_dir).eval()
    draft = tf.AutoModelForCausalLM.from_pretrained(draft_dir).eval()
    tok.padding_side, tok.pad_token = "left", tok.eos_token
    return target, draft, tok


def _greedy(target, ids, n=16):
    return target.generate(ids, max_new_tokens=n, do_sample=False)


def test_the_callable_with_tiers_off_is_greedy_generate(pair):
    target, draft, tok = pair
    ids = tok("def walk(top):\n    for", return_tensors="pt").input_ids
    expected = _greedy(target, ids)
    # every lossless method: tiers off, SD, the self-speculative slim drafting alone (no draft model), cascade SD
    for policy, slim, drafter in ((OFF, [0, 1], draft), (DecodePolicy(method="sd", gamma=4), None, draft),
                                  (DecodePolicy(method="ar"), None, None),
                                  (DecodePolicy(method="self_sd", gamma=3), [0, 1], None),
                                  (DecodePolicy(method="cascade_sd", gamma=3), [0, 1], draft)):
        out = target.generate(ids, custom_generate=viasd.hf.generate, draft_model=drafter, viasd_policy=policy,
                              slim_layers=slim, max_new_tokens=16, do_sample=False)
        assert torch.equal(out, expected), policy.method
    # self-speculation under SD and under VIA-SD: the model's first layer drafts, a deeper slim is the middle tier
    for policy in (None, OFF):
        out = target.generate(ids, custom_generate=viasd.hf.generate, draft_layers=[0], viasd_policy=policy,
                              slim_layers=[0, 1, 2], max_new_tokens=16, do_sample=False)
        assert torch.equal(out, expected), policy
    # the slim tiers on: lossy, but the same shape and each row's statistics on the dictionary output
    on = DecodePolicy(method="viasd", gamma=3, tau_accept=0.5, tau_slim=0.3)
    out = target.generate(ids, custom_generate=viasd.hf.generate, draft_model=draft, viasd_policy=on, slim_layers=[0, 1],
                          max_new_tokens=16, do_sample=False, return_dict_in_generate=True)
    assert isinstance(out, viasd.hf.ViasdGenerateOutput) and out.sequences.shape[0] == 1
    (stats,) = out.viasd_stats
    assert stats.method == "viasd" and stats.new_tokens == out.sequences.shape[1] - ids.shape[1]


def test_a_left_padded_batch_decodes_each_row_as_alone(pair):
    target, draft, tok = pair
    texts = ["import os\n", "class Stack:\n    def push(self, item):"]
    batch = tok(texts, return_tensors="pt", padding=True)
    out = target.generate(**batch, custom_generate=viasd.hf.generate, draft_model=draft, viasd_policy=OFF,
                          slim_layers=[0, 1], max_new_tokens=12, do_sample=False)
    width = batch.input_ids.shape[1]
    assert torch.equal(out[:, :width], batch.input_ids)
    for row, text in zip(out, texts):
        prompt = tok(text, return_tensors="pt").input_ids
        alone = _greedy(target, prompt, 12)[0, prompt.shape[1]:].tolist()
        assert row[width: width + len(alone)].tolist() == alone
        assert set(row[width + len(alone):].tolist()) <= {tok.pad_token_id}  # a row that ended early: padded


def test_the_folder_form_takes_the_assistant_and_streams(pair):
    target, draft, tok = pair
    ids = tok("def walk(top):\n    for", return_tensors="pt").input_ids

    class Collect(tf.generation.BaseStreamer):
        def __init__(self):
            self.puts, self.ended = [], False

        def put(self, value):
            self.puts.append(value.reshape(-1).tolist())

        def end(self):
            self.ended = True

    streamer = Collect()
    out = target.generate(ids, custom_generate=str(REPO), trust_remote_code=True, assistant_model=draft,
                          viasd_policy=DecodePolicy(method="sd", gamma=3), max_new_tokens=16, do_sample=False,
                          streamer=streamer)
    assert torch.equal(out, _greedy(target, ids))
    assert streamer.ended and streamer.puts[0] == ids[0].tolist()
    assert [t for put in streamer.puts[1:] for t in put] == out[0, ids.shape[1]:].tolist()
    assert len(streamer.puts) > 2  # block by block as they were settled, not all at the end


def test_what_the_tiers_cannot_honour_is_one_clear_error(pair):
    target, draft, tok = pair
    ids = tok("x = 1\n", return_tensors="pt").input_ids

    class Shift(tf.LogitsProcessor):
        def __call__(self, input_ids, scores):
            return scores

    common = dict(custom_generate=viasd.hf.generate, draft_model=draft, max_new_tokens=4)
    with pytest.raises(PolicyError, match="num_beams"):
        target.generate(ids, num_beams=2, **common)
    with pytest.raises(PolicyError, match="logits processor Shift"):
        target.generate(ids, logits_processor=tf.LogitsProcessorList([Shift()]), **common)
