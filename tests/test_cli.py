"""`viasd generate`: plain and JSON output, and one clear error line with exit status 2 for every
bad input a user can give."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as tf
from tiny_models import build_model, build_tokenizer

from viasd.cli import main

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dirs(pair_dirs):
    return pair_dirs("llama")


def run_cli(capsys, *args):
    code = main(["generate", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_is_one_object(dirs, capsys):
    target, draft = dirs
    code, out, _ = run_cli(capsys, "--target", target, "--draft", draft, "--keep-layers", "0,2", "--method", "viasd",
                           "--gamma", "3", "--max-new-tokens", "12", "--device", "cpu", "--prompt", "def f(x):", "--json")
    assert code == 0
    data = json.loads(out)
    assert set(data) == {"text", "token_ids", "stats", "policy", "generation"}
    assert data["policy"]["gamma"] == 3 and data["policy"]["method"] == "viasd" and data["policy"]["tau_accept"] == 1.0
    assert len(data["token_ids"]) == data["stats"]["new_tokens"] <= 12
    assert data["stats"]["method"] == "viasd" and "rejection_rate" in data["stats"]


def test_plain_output_and_every_method(dirs, capsys, tmp_path):
    target, draft = dirs
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"keep_layers": [0, 2], "cost": 1.0}))
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("import os\n")
    texts = {}
    for method in ("ar", "sd", "cascade_sd", "spec_cascade", "viasd"):
        code, out, err = run_cli(capsys, "--target", target, "--draft", draft, "--mask", mask, "--method", method,
                                 "--max-new-tokens", "10", "--prompt-file", prompt, "--temperature", "0")
        assert code == 0, err
        assert f"method {method}" in err and "passes:" in err
        texts[method] = out
    assert texts["ar"] == texts["sd"] == texts["cascade_sd"]


def test_a_prompts_file_decodes_as_a_batch(dirs, capsys, tmp_path):
    """--prompts-file: one JSON object per prompt, in order, each what its prompt decodes to alone."""
    target, draft = dirs
    prompts = ["def f(x):", "import os\n", "class A:\n    pass\n"]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join([json.dumps(prompts[0]), json.dumps({"prompt": prompts[1]}), json.dumps(prompts[2])]))
    base = ["--target", target, "--draft", draft, "--keep-layers", "0,2", "--method", "sd", "--max-new-tokens", "8",
            "--device", "cpu", "--json"]
    code, out, err = run_cli(capsys, *base, "--prompts-file", path, "--batch-size", "2")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    alone = [json.loads(run_cli(capsys, *base, "--prompt", p)[1]) for p in prompts]
    assert [r["token_ids"] for r in rows] == [a["token_ids"] for a in alone]


def test_oracle_router_writes_the_targets_greedy_output(dirs, capsys):
    target, draft = dirs
    args = ["--target", target, "--draft", draft, "--keep-layers", "0,2", "--max-new-tokens", "16", "--device", "cpu",
            "--prompt", "class A:", "--json"]
    ar = json.loads(run_cli(capsys, *args, "--method", "ar")[1])
    oracle = json.loads(run_cli(capsys, *args, "--method", "viasd", "--router", "oracle")[1])
    assert oracle["token_ids"] == ar["token_ids"] and oracle["stats"]["peek_passes"] > 0


def test_sampling_options_and_seed(dirs, capsys):
    target, draft = dirs
    args = ["--target", target, "--draft", draft, "--method", "sd", "--temperature", "0.8", "--top-k", "20",
            "--top-p", "0.9", "--max-new-tokens", "10", "--prompt", "x = ", "--json"]
    first = json.loads(run_cli(capsys, *args, "--seed", "1")[1])
    again = json.loads(run_cli(capsys, *args, "--seed", "1")[1])
    assert first["token_ids"] == again["token_ids"]


def test_console_script_runs(dirs):
    target, _ = dirs
    exe = shutil.which("viasd") or os.path.join(os.path.dirname(sys.executable), "viasd")
    proc = subprocess.run([exe, "generate", "--target", str(target), "--method", "ar", "--max-new-tokens", "5",
                           "--prompt", "def", "--json", "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)["token_ids"]) == 5


@pytest.fixture(scope="module")
def odd_models(tmp_path_factory):
    """A draft whose tokenizer maps ids to other tokens, and an encoder-decoder model (not a draft for a
    decoder-only target)."""
    root = tmp_path_factory.mktemp("odd")
    other_tok = build_tokenizer(root / "tok", vocab_size=300)
    other = build_model(root / "other-vocab", "llama", 1, 0, other_tok)
    data = json.loads((other / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    for token, i in list(vocab.items()):  # reverse the order of ids 50..149
        if 50 <= i < 150:
            vocab[token] = 199 - i
    (other / "tokenizer.json").write_text(json.dumps(data))
    t5 = root / "t5"
    torch.manual_seed(0)
    tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                                              num_heads=2)).save_pretrained(t5)
    return other, t5


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def bad_inputs(dirs, odd_models, tmp_path):
    target, draft = dirs
    other, t5 = odd_models
    base = ["--target", target, "--draft", draft, "--max-new-tokens", "5", "--device", "cpu"]
    bad_mask = tmp_path / "bad.json"
    bad_mask.write_text('{"keep_layers": [0, 0]}')
    return {
        "missing model": (["--target", tmp_path / "nope", "--method", "ar", "--prompt", "x"], "does not exist"),
        "a draft with another tokenizer for cascade_sd": (["--target", target, "--draft", other, "--method",
                                                           "cascade_sd", "--keep-layers", "0", "--prompt", "x"],
                                                          "another tokenizer than the target's runs sd and viasd"),
        "out-of-range layer": ([*base, "--keep-layers", "0,7", "--prompt", "x"], "layer 7 is out of range"),
        "duplicate layer": ([*base, "--mask", bad_mask, "--prompt", "x"], "listed twice"),
        "missing mask": ([*base, "--mask", tmp_path / "none.json", "--prompt", "x"], "does not exist"),
        "empty prompt": ([*base, "--keep-layers", "0", "--prompt", ""], "prompt is empty"),
        "missing prompt file": ([*base, "--keep-layers", "0", "--prompt-file", tmp_path / "p.txt"], "prompt file"),
        "over-long prompt": ([*base[:-4], "--max-new-tokens", "500", "--keep-layers", "0", "--prompt", "x" * 200],
                             "supports 512"),
        "no draft": (["--target", target, "--method", "sd", "--prompt", "x"], "needs --draft"),
        "no mask": ([*base, "--method", "viasd", "--prompt", "x"], "needs a slim verifier"),
        "encoder-decoder draft": ([*base[:2], "--draft", t5, *base[4:], "--method", "sd", "--prompt", "x"],
                                  "a pair must be of one kind"),
        "hub id offline": (["--target", "someone/not-a-real-model-xyz", "--method", "ar", "--prompt", "x"],
                           "Hugging Face Hub"),
        "bad gamma": ([*base, "--keep-layers", "0", "--gamma", "0", "--prompt", "x"], "gamma"),
        "bad device": ([*base, "--keep-layers", "0", "--device", "tpu9", "--prompt", "x"], "device"),
        "learned router without its file": ([*base, "--keep-layers", "0", "--router", "learned", "--prompt", "x"],
                                            "--router-file"),
        "missing router file": ([*base, "--keep-layers", "0", "--router", "learned", "--router-file",
                                 tmp_path / "router.json", "--prompt", "x"], "viasd train-router"),
        "sampled oracle": ([*base, "--keep-layers", "0", "--router", "oracle", "--temperature", "1", "--prompt", "x"],
                           "greedy"),
        "no models": (["--method", "ar", "--prompt", "x"], "give the models"),
        "not a per-token setting": ([*base, "--keep-layers", "0", "--generation", "num_beams=4", "--prompt", "x"],
                                    "unknown generation setting num_beams"),
        "a study cell with models": (["--pair", "default", "--task", "stdlib_continuation", "--draft", draft,
                                      "--prompt", "x"], "--draft: with --pair the models"),
        "a study cell without its task": (["--pair", "default", "--prompt", "x"], "--pair needs --task"),
        "a bad prompts file": ([*base, "--keep-layers", "0", "--prompts-file", _write(tmp_path / "p.jsonl", "{oops\n")],
                               "p.jsonl:1: not JSON"),
        "batch size without a prompts file": ([*base, "--keep-layers", "0", "--batch-size", "2", "--prompt", "x"],
                                              "--batch-size takes a number"),
        "a study cell with a bad run": (["--pair", "default", "--task", "stdlib_continuation", "--run", "viasd-nope",
                                         "--params", REPO / "params.yaml", "--prompt", "x"], "--run"),
    }


CASES = ["missing model", "a draft with another tokenizer for cascade_sd", "out-of-range layer",
         "duplicate layer", "missing mask", "empty prompt", "missing prompt file", "over-long prompt", "no draft",
         "no mask", "encoder-decoder draft", "hub id offline", "bad gamma", "bad device",
         "learned router without its file", "missing router file", "sampled oracle", "no models",
         "not a per-token setting", "a study cell with models", "a study cell without its task",
         "a study cell with a bad run", "a bad prompts file", "batch size without a prompts file"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_gives_one_clear_error(dirs, odd_models, tmp_path, capsys, case):
    args, needle = bad_inputs(dirs, odd_models, tmp_path)[case]
    code, out, err = run_cli(capsys, *args)
    assert code == 2
    assert out == ""
    lines = [line for line in err.splitlines() if line.startswith("viasd: error:")]
    assert len(lines) == 1 and needle in lines[0], err


def test_a_draft_with_another_tokenizer_from_the_command_line(dirs, odd_models, capsys):
    """The draft's tokenizer maps ids to other tokens: its proposals go through text, the output is ar's."""
    target, _ = dirs
    other, _ = odd_models
    args = ["--target", target, "--max-new-tokens", "12", "--prompt", "def f(x):", "--json", "--device", "cpu"]
    ar = json.loads(run_cli(capsys, *args, "--method", "ar")[1])
    sd = json.loads(run_cli(capsys, *args, "--draft", other, "--method", "sd")[1])
    assert sd["token_ids"] == ar["token_ids"] and sd["stats"]["draft_own_tokens"] > 0


def test_independent_intermediate_from_the_command_line(dirs, pair_dirs, capsys):
    target, draft = dirs
    other, _ = pair_dirs("gpt_neox")
    code, out, err = run_cli(capsys, "--target", target, "--draft", draft, "--independent", other, "--method", "viasd",
                             "--max-new-tokens", "8", "--prompt", "def f(x):", "--json", "--device", "cpu")
    assert code == 0, err
    stats = json.loads(out)["stats"]
    assert "slim" in stats["passes"] and stats["new_tokens"] == len(json.loads(out)["token_ids"])


def test_threads_never_exceed_the_cores_given_or_available(monkeypatch):
    from viasd.cli import threads

    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert threads.thread_budget({}) == 2
    assert threads.thread_budget({"OMP_NUM_THREADS": "8"}) == 2  # a job granted 8 on a 2-core machine
    assert threads.thread_budget({"OMP_NUM_THREADS": "1"}) == 1
    assert threads.thread_budget({"OMP_NUM_THREADS": "junk"}) == 2


def test_a_stage_command_runs_with_the_granted_threads(tmp_path):
    code = "import sys; from viasd.cli.threads import limit_threads; import torch; " \
           "limit_threads(); print(torch.get_num_threads())"
    env = {**os.environ, "OMP_NUM_THREADS": "64"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout) == len(os.sched_getaffinity(0))


def test_old_bench_method_names_still_work_with_a_warning(caplog):
    """The bench's oracle and rules methods are spelled as the study's runs now; the old names map, saying so."""
    from viasd.cli.bench import renamed

    with caplog.at_level("WARNING"):
        assert renamed("viasd_oracle_budget") == "viasd-oracle_budget"
    assert "is now 'viasd-oracle_budget'" in caplog.text
    assert renamed("sd") == "sd"
