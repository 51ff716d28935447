"""train-model: the smoke family trains through the real code, honours the architecture fields,
resumes exactly after being killed, and distils the draft from the target; the trained family decodes and
evaluates through the stage commands (`viasd bench` on it: test_benchmark.py)."""

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file
from study_fixtures import smoke_params

from viasd import DecodePolicy, config, load_models
from viasd.errors import VocabularyMismatchError
from viasd.models import ModelSet
from viasd.training.train import TrainingError, train_model

TINY = {"layers": 2, "hidden": 32, "heads": 2, "intermediate": 64, "train_tokens": 300000, "lr": 3e-3}


def test_family_trains_and_reports(study):
    _, params = study
    reports = {}
    for role in ("target", "draft", "independent"):
        out = params.model_dir(role)
        assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
        reports[role] = json.loads((out / "training.json").read_text())
        arch = params.family.arch(role)
        cfg = json.loads((out / "config.json").read_text())
        assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"]) == \
            (arch.layers, arch.hidden, arch.heads, arch.intermediate)
        assert cfg["vocab_size"] == params.data.vocab_size
        assert reports[role]["test_perplexity"] > 1 and reports[role]["parameters"] > 0
    assert reports["draft"]["distilled"] and not reports["target"]["distilled"]
    assert reports["target"]["test_nll"] < reports["draft"]["test_nll"]
    assert not list(params.models_dir.glob("*/.*checkpoint"))


def test_trained_family_decodes(study):
    _, params = study
    models = load_models(params.model_dir("target"), draft=params.model_dir("draft"), masks=[[0, 2]], device="cpu")
    ids = models.encode("def main():\n")
    ar = models.generate(ids, DecodePolicy(method="ar", max_new_tokens=16, eos_token_ids=()))
    sd = models.generate(ids, DecodePolicy(method="sd", gamma=3, max_new_tokens=16, eos_token_ids=()))
    assert sd.token_ids == ar.token_ids


def _weights(path):
    return load_file(str(path / "model.safetensors"))


@pytest.mark.slow
def test_killed_training_resumes_to_the_same_weights(study, tmp_path):
    src_tmp, params = study
    override = {"models": {"dir": "models-resume", "families": {"smoke": {"target": TINY}}},
                "data": {"dir": str(params.data.dir)}, "train": {"checkpoint_every": 10}}
    path = smoke_params(tmp_path, override)
    resumed = config.load(path)
    cmd = [sys.executable, "-m", "viasd.cli", "train-model", "--role", "target", "--params", str(path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    ckpt = resumed.models_dir / "smoke" / ".target.checkpoint" / "checkpoint.pt"
    deadline = time.time() + 240
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)
    assert proc.poll() is None, "training finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    step_at_kill = torch.load(ckpt, weights_only=False)["step"]
    assert not (resumed.model_dir("target") / "model.safetensors").exists()
    train_model(resumed, "target", progress=False)  # resumes from the checkpoint
    report = json.loads((resumed.model_dir("target") / "training.json").read_text())
    assert report["steps"] > step_at_kill >= 10
    (tmp_path / "fresh").mkdir()
    fresh = config.load(smoke_params(tmp_path / "fresh", {**override, "models": {**override["models"],
                                                                                 "dir": "models-fresh"}}))
    train_model(fresh, "target", progress=False)
    a, b = _weights(resumed.model_dir("target")), _weights(fresh.model_dir("target"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_distillation_needs_the_target(study, tmp_path):
    _, params = study
    fresh = config.load(smoke_params(tmp_path, {"models": {"dir": "empty"}, "data": {"dir": str(params.data.dir)}}))
    with pytest.raises(TrainingError, match="needs the trained target"):
        train_model(fresh, "draft", progress=False)


def test_missing_data_is_a_clear_error(tmp_path):
    params = config.load(smoke_params(tmp_path))
    with pytest.raises(TrainingError, match="run `viasd prepare-data` first"):
        train_model(params, "target", progress=False)


def test_tokenizer_that_does_not_match_the_models(study, tmp_path):
    _, params = study
    from tiny_models import build_tokenizer

    other = build_tokenizer(tmp_path / "tok", vocab_size=params.data.vocab_size + 100)
    models = load_models(params.model_dir("target"), device="cpu")
    with pytest.raises(VocabularyMismatchError, match="output layer has only"):
        ModelSet(models.target, other, models.target, draft_tokenizer=other)


def test_decode_and_evaluate_commands_on_the_trained_family(study, capsys):
    from viasd.cli import main
    from viasd.study.paths import decode_paths, eval_path

    src_tmp, params = study
    base = ["--params", str(src_tmp / "params.yaml"), "--no-track", "--task", "stdlib_continuation"]
    assert main(["decode", *base, "--run", "sd-gamma_3", "--limit", "2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["examples"] == 2 and summary["run"] == "sd-gamma_3" and 0 <= summary["acceptance_rate"] <= 1
    paths = decode_paths(params, "smoke", "stdlib_continuation", "sd-gamma_3")
    full = json.loads(paths["summary"].read_text())
    assert full["policy"]["gamma"] == 3 and full["method"] == "sd" and full["ablation"] == "gamma_3"
    assert full["speedup_vs_ar"] == pytest.approx(full["tokens_per_second"] / full["ar_tokens_per_second"])
    assert full["speedup_vs_ar"] == pytest.approx(full["ar_wall_time_s"] / full["wall_time_s"])  # lossless: same tokens
    rows = [json.loads(line) for line in paths["rows"].read_text().splitlines()]
    assert len(rows) == 2 and sum(r["stats"]["new_tokens"] for r in rows) == full["new_tokens"]
    assert all(r["token_ids"] == r["ar_token_ids"] for r in rows)  # greedy sd is lossless
    assert main(["evaluate", *base, "--run", "sd-gamma_3"]) == 0
    capsys.readouterr()
    quality = json.loads(eval_path(params, "smoke", "stdlib_continuation", "sd-gamma_3").read_text())["quality"]
    assert quality["agreement"] == 1.0 and {"nll", "chrf", "bleu", "exact_prefix"} <= set(quality)
    # several runs in one command (sd at a fixed gamma: this folder has no threshold search): one load, each
    # prompt decoded once with ar, every run beside it
    assert main(["decode", *base, "--run", "ar", "--run", "sd-gamma_4", "--run", "sd-gamma_2", "--limit", "3"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["run"] for p in printed] == ["ar", "sd-gamma_4", "sd-gamma_2"]
    summaries = {r: json.loads(decode_paths(params, "smoke", "stdlib_continuation", r)["summary"].read_text())
                 for r in ("ar", "sd-gamma_4", "sd-gamma_2")}
    ar_rows = [json.loads(line) for line in decode_paths(params, "smoke", "stdlib_continuation", "ar")["rows"]
               .read_text().splitlines()]
    for run in ("sd-gamma_4", "sd-gamma_2"):
        rows = [json.loads(line) for line in decode_paths(params, "smoke", "stdlib_continuation", run)["rows"]
                .read_text().splitlines()]
        assert [r["ar_token_ids"] for r in rows] == [r["token_ids"] for r in ar_rows] == [r["token_ids"] for r in rows]
        assert summaries[run]["ar_wall_time_s"] == pytest.approx(summaries["ar"]["wall_time_s"])
    assert summaries["ar"]["speedup_vs_ar"] == 1.0 and summaries["ar"]["passes"].get("draft", 0) == 0
    # the same tokens score the same (scored once): fidelity 1 and ar's NLL for every lossless run
    assert all(summaries[r]["fidelity"] == 1.0 and summaries[r]["target_nll"] == summaries["ar"]["target_nll"]
               for r in ("sd-gamma_4", "sd-gamma_2"))
    assert main(["evaluate", *base, "--run", "ar", "--run", "sd-gamma_4"]) == 0
    evaluated = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["run"] for e in evaluated] == ["ar", "sd-gamma_4"] and all(e["quality"]["agreement"] == 1.0 for e in evaluated)
    # the evaluation's NLL and fidelity are the decode's target scores, pooled (no second target pass)
    for run in ("ar", "sd-gamma_4"):
        quality = json.loads(eval_path(params, "smoke", "stdlib_continuation", run).read_text())["quality"]
        assert quality["nll"] == pytest.approx(summaries[run]["target_nll"]) and quality["fidelity"] == 1.0
        assert quality["fidelity_se"] == 0.0  # clustered by source file (three files here): no spread when lossless
    # a run that would decode exactly as another (sd-gamma_4 is sd at decode.sd_gamma 4) takes its decode
    fixed = src_tmp / "sd-gamma-4.yaml"
    fixed.write_text("decode: {sd_gamma: 4}\n")
    assert main(["decode", *base, "--config", str(fixed), "--run", "sd", "--run", "sd-gamma_4", "--limit", "2"]) == 0
    capsys.readouterr()
    twins = {r: json.loads(decode_paths(params, "smoke", "stdlib_continuation", r)["summary"].read_text())
             for r in ("sd", "sd-gamma_4")}
    assert twins["sd"]["same_decode_as"] is None and twins["sd-gamma_4"]["same_decode_as"] == "sd"
    assert twins["sd-gamma_4"]["wall_time_s"] == twins["sd"]["wall_time_s"] and twins["sd-gamma_4"]["run"] == "sd-gamma_4"
    assert (decode_paths(params, "smoke", "stdlib_continuation", "sd-gamma_4")["rows"].read_text()
            == decode_paths(params, "smoke", "stdlib_continuation", "sd")["rows"].read_text())
    assert main(["decode", *base, "--run", "sd-no_tier2"]) == 2
    assert "no_tier2 is a VIA-SD ablation" in capsys.readouterr().err
    # a VIA-SD run whose thresholds were never tuned (the session's study folder may hold tuned ones: hidden here)
    from viasd.study.paths import threshold_dirs

    tuned = threshold_dirs(params, "stdlib_continuation", "smoke")["models"]
    hidden = tuned.with_name(tuned.name + ".hidden")
    if tuned.exists():
        tuned.rename(hidden)
    try:
        assert main(["decode", *base, "--run", "viasd"]) == 2
        assert "run the stage that writes it first" in capsys.readouterr().err
    finally:
        if hidden.exists():
            hidden.rename(tuned)


def test_layer_drop_rates_rise_with_depth():
    from viasd.training.train import drop_rates, kept_layers

    assert drop_rates(4, 0.3) == [0.0, 0.3, 0.3, 0.3]
    for shape in ("linear", "exp"):
        rates = drop_rates(12, 0.6, shape)
        assert rates[0] == 0.0 and abs(rates[-1] - 0.6) < 1e-12
        assert all(a < b for a, b in zip(rates[1:], rates[2:]))
    assert drop_rates(12, 0.6, "exp")[6] < drop_rates(12, 0.6, "linear")[6]  # LayerSkip: late layers carry it
    with pytest.raises(TrainingError, match="layer_drop_shape"):
        drop_rates(4, 0.3, "cubic")
    # layer 0 is always kept; a rate rising with depth drops late layers more often than early ones
    kept = [kept_layers(12, 0.8, step, 0, "target", "exp") for step in range(400)]
    assert all(k[0] == 0 for k in kept)
    share = [sum(layer in k for k in kept) / len(kept) for layer in range(12)]
    assert share[1] > 0.9 and share[11] < 0.35


def test_early_exit_and_depth_shaped_layer_drop_train_and_are_recorded(study, tmp_path):
    _, params = study
    arch = {**TINY, "layers": 3, "train_tokens": 8000, "layer_drop": 0.5, "layer_drop_shape": "exp",
            "early_exit": 0.5}
    fresh = config.load(smoke_params(tmp_path, {"models": {"dir": "models-ee", "families": {"smoke": {"target": arch}}},
                                                "data": {"dir": str(params.data.dir)}}))
    out = train_model(fresh, "target", progress=False)
    report = json.loads((out / "training.json").read_text())
    assert (report["layer_drop_shape"], report["early_exit"]) == ("exp", 0.5)
    assert math.isfinite(report["test_nll"]) and report["loss_curve"][-1] < report["loss_curve"][0]


def test_a_fixed_exit_layer_reads_the_layers_below_it_that_the_step_kept():
    from viasd.training.train import exit_point

    assert exit_point([0, 1, 2, 3, 4, 5, 6, 7], 0, 0, "target", layer=6) == 6  # hidden_states[6]: after layer 5
    assert exit_point([0, 2, 5, 6, 9], 0, 0, "target", layer=6) == 3  # layers 0, 2, 5 kept below 6
    assert exit_point([0, 1, 3], 0, 0, "target", layer=6) is None  # the whole view: its own final output
    drawn = {exit_point([0, 1, 2, 3], s, 0, "target") for s in range(40)}
    assert drawn == {1, 2, 3}


def test_an_exit_distilled_from_the_full_model_trains_and_is_recorded(study, tmp_path):
    _, params = study
    arch = {**TINY, "layers": 4, "train_tokens": 8000, "layer_drop": 0.5, "layer_drop_shape": "exp",
            "early_exit": 0.5, "early_exit_layer": 2, "early_exit_loss": "full"}
    fresh = config.load(smoke_params(tmp_path, {"models": {"dir": "models-ee", "families": {"smoke": {"target": arch}}},
                                                "data": {"dir": str(params.data.dir)}}))
    out = train_model(fresh, "target", progress=False)
    report = json.loads((out / "training.json").read_text())
    assert (report["early_exit_layer"], report["early_exit_loss"]) == (2, "full")
    assert math.isfinite(report["test_nll"]) and report["loss_curve"][-1] < report["loss_curve"][0]
    bad = {**arch, "early_exit_layer": 4}
    with pytest.raises(config.ConfigError, match="early_exit_layer: 4 is not below the model's 4 layers"):
        config.load(smoke_params(tmp_path, {"models": {"families": {"smoke": {"target": bad}}}}))


def test_bfloat16_mixed_precision_trains_float32_weights_and_is_recorded(study, tmp_path):
    from viasd.training.train import autocast, batch_at, load_token_stream, step_loss

    _, params = study
    arch = {**TINY, "train_tokens": 8000}
    fresh = config.load(smoke_params(tmp_path, {"models": {"dir": "models-bf16", "families": {"smoke": {"target": arch}}},
                                                "data": {"dir": str(params.data.dir)},
                                                "train": {"precision": "bfloat16"}}))
    out = train_model(fresh, "target", progress=False)
    report = json.loads((out / "training.json").read_text())
    assert (report["precision"], report["device"]) == ("bfloat16", "cpu")
    assert math.isfinite(report["test_nll"]) and report["loss_curve"][-1] < report["loss_curve"][0]
    assert {w.dtype for w in _weights(out).values()} == {torch.float32}  # mixed precision: the weights stay float32
    # the forward passes do run in bfloat16: the same step's loss moves by bfloat16's rounding, no more
    model = load_models(out, device="cpu").target.train()
    batch = batch_at(load_token_stream(fresh.data.dir, "train"), 0, 2, 32, 0, "target")
    arch_obj, tp = fresh.family.arch("target"), fresh.train
    device = torch.device("cpu")
    with autocast("float32", device):
        exact = step_loss(model, None, arch_obj, tp, batch, 0, 0, "target").item()
    with autocast("bfloat16", device):
        mixed = step_loss(model, None, arch_obj, tp, batch, 0, 0, "target").item()
    assert mixed != exact and abs(mixed - exact) < 0.02 * exact
    with pytest.raises(config.ConfigError, match="precision"):
        config.load(smoke_params(tmp_path, {"train": {"precision": "float16"}}))


def test_auto_precision_is_bfloat16_only_where_the_device_computes_it_natively():
    from viasd.training.train import native_bfloat16, resolve_precision

    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == ("bfloat16" if native_bfloat16(cpu) else "float32")
    assert resolve_precision("float32", cpu) == "float32" and resolve_precision("bfloat16", cpu) == "bfloat16"
    assert resolve_precision("auto", torch.device("meta")) == "float32"
