"""The measured option of docs/method.md ("Encoder-decoder pairs"): a slim that shares the target's encoder
against one that runs its own, shallower encoder (`dimr.encoder_keep_ratio`), on the tiny random T5 and
BART pairs the tests build (T5: 4 encoder and 4 decoder layers; BART: 2 and 4; d_model 64), CPU.

    python tests/measure_encoder_skip.py

Prints, per layout and slim: the DIMR path cost on calibration windows, and for `cascade_sd` (lossless:
the same tokens whatever the slim, so the times compare like for like) the median decode time, the
encoder time per decode and the passes per token."""
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from conftest import PROMPTS  # noqa: E402
from test_seq2seq import build_seq2seq_pair  # noqa: E402
from tiny_models import build_tokenizer  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from viasd import DecodePolicy, load_models  # noqa: E402
from viasd.decoding.slim import RoutingMask, SlimVerifier, num_encoder_layers  # noqa: E402
from viasd.search.dimr import MaskCost  # noqa: E402

root = Path(tempfile.mkdtemp(prefix="encoder-skip-"))
build_tokenizer(root / "tok")
tok = AutoTokenizer.from_pretrained(root / "tok")
out = {}
for layout in ("t5", "bart"):
    target, draft = build_seq2seq_pair(root, layout, tok)
    models = load_models(target, draft=draft, device="cpu", dtype="float32")
    n_enc = num_encoder_layers(models.target)
    dec = RoutingMask.from_layers([0, 2], 4)
    half = list(range(max(1, n_enc // 2)))
    variants = {"shared encoder": dec, f"encoder 0..{half[-1]}": dec.with_encoder(half, n_enc)}
    windows = torch.tensor([tok(p * 20)["input_ids"][:64] for p in PROMPTS])
    cost = MaskCost(models.target, models.draft, windows, models.vocab_size, "path", 4)
    prompts = [tok(p * k)["input_ids"] for p in PROMPTS for k in (4, 12)]
    res = {}
    for name, mask in variants.items():
        sets = models.with_slims([SlimVerifier(models.target, mask)])
        policy = DecodePolicy(method="cascade_sd", gamma=3, max_new_tokens=32, eos_token_ids=())
        for p in prompts[:2]:
            sets.generate(p, policy)  # warm-up
        times, enc, tokens, slim_passes, full = [], [], 0, 0, 0
        for _ in range(5):
            for p in prompts:
                r = sets.generate(p, policy)
                times.append(r.stats.wall_time_s)
                enc.append(r.stats.encoder_time_s)
                tokens += r.stats.new_tokens
                slim_passes += r.stats.passes.get("slim", 0)
                full += r.stats.passes.get("target", 0)
        res[name] = {"path_cost": round(cost.exact(mask), 4), "tokens": tokens,
                     "median_decode_ms": round(1000 * statistics.median(times), 2),
                     "median_encoder_ms": round(1000 * statistics.median(enc), 3),
                     "full_passes_per_token": round(full / tokens, 3), "slim_passes_per_token": round(slim_passes / tokens, 3)}
    out[layout] = {"encoder_layers": n_enc, **res}
print(json.dumps(out, indent=1))
