"""train-model: the smoke family trains through the real code, honours the architecture fields,
resumes exactly after being killed, and distils the draft from the target."""

import json
import math
import os
import signal
import statistics
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
    # several runs in one command: one load, each prompt decoded once with ar, every run beside it
    assert main(["decode", *base, "--run", "ar", "--run", "sd", "--run", "sd-gamma_2", "--limit", "3"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["run"] for p in printed] == ["ar", "sd", "sd-gamma_2"]
    summaries = {r: json.loads(decode_paths(params, "smoke", "stdlib_continuation", r)["summary"].read_text())
                 for r in ("ar", "sd", "sd-gamma_2")}
    ar_rows = [json.loads(line) for line in decode_paths(params, "smoke", "stdlib_continuation", "ar")["rows"]
               .read_text().splitlines()]
    for run in ("sd", "sd-gamma_2"):
        rows = [json.loads(line) for line in decode_paths(params, "smoke", "stdlib_continuation", run)["rows"]
                .read_text().splitlines()]
        assert [r["ar_token_ids"] for r in rows] == [r["token_ids"] for r in ar_rows] == [r["token_ids"] for r in rows]
        assert summaries[run]["ar_wall_time_s"] == pytest.approx(summaries["ar"]["wall_time_s"])
    assert summaries["ar"]["speedup_vs_ar"] == 1.0 and summaries["ar"]["passes"].get("draft", 0) == 0
    # the same tokens score the same (scored once): fidelity 1 and ar's NLL for every lossless run
    assert all(summaries[r]["fidelity"] == 1.0 and summaries[r]["target_nll"] == summaries["ar"]["target_nll"]
               for r in ("sd", "sd-gamma_2"))
    assert main(["evaluate", *base, "--run", "ar", "--run", "sd"]) == 0
    evaluated = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["run"] for e in evaluated] == ["ar", "sd"] and all(e["quality"]["agreement"] == 1.0 for e in evaluated)
    # the evaluation's NLL and fidelity are the decode's target scores, pooled (no second target pass)
    for run in ("ar", "sd"):
        quality = json.loads(eval_path(params, "smoke", "stdlib_continuation", run).read_text())["quality"]
        assert quality["nll"] == pytest.approx(summaries[run]["target_nll"]) and quality["fidelity"] == 1.0
        assert quality["fidelity_se"] == 0.0  # clustered by source file (three files here): no spread when lossless
    # a run that would decode exactly as another (sd-gamma_4 is sd at the default gamma 4) takes its decode
    assert main(["decode", *base, "--run", "sd", "--run", "sd-gamma_4", "--limit", "2"]) == 0
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


def test_bench_on_the_smoke_family_writes_the_report(study, capsys):
    """Shape of `viasd bench`'s JSON on two prompts; speed figures are reported, never asserted."""
    from viasd.cli import main
    from viasd.study.paths import bench_paths

    src_tmp, params = study
    base = ["--params", str(src_tmp / "params.yaml"), "--no-track"]
    assert main(["dimr-search", *base]) == 0
    assert main(["bench", *base, "--prompts", "2", "--repeats", "2", "--max-new-tokens", "12", "--gamma", "3"]) == 0
    out = capsys.readouterr().out
    result = json.loads(bench_paths(params, "smoke", "stdlib_continuation")["json"].read_text())
    from viasd.study.paths import threshold_paths

    methods = ["hf_ar", "hf_assisted", "hf_assisted_fixed", "ar", "sd", "cascade_sd", "spec_cascade", "viasd",
               "viasd_oracle", "viasd_oracle_budget"]
    # the hand rules' own tuned policy, when the session's study folder holds its search
    methods += ["viasd_rules"] if threshold_paths(params, "stdlib_continuation", "smoke", "rules")["json"].exists() else []
    assert set(result["methods"]) == set(methods) and all(m in out for m in methods)
    # the oracle: the target's greedy output, timed without its peeks (it reads the greedy outputs decoded before
    # the rounds) and modelled, and the share of its headroom viasd takes, each way; beside every ratio how close
    # the model is
    oracle = result["methods"]["viasd_oracle"]
    assert oracle["quality"]["fidelity"] == 1.0 and "tokens_per_second_without_peek" in oracle
    assert "viasd_oracle_vs_sd_model" in result["ratios_model"] and "viasd_oracle_vs_sd" in result["ratios"]
    assert result["ratios"]["viasd_oracle_vs_sd"] == pytest.approx(
        oracle["tokens_per_second_without_peek"] / result["methods"]["sd"]["tokens_per_second"]["median"])
    # the budgeted oracle at the search's fidelity floor (smoke: 0.5), its peeks taken off each timed round
    budgeted = result["methods"]["viasd_oracle_budget"]
    assert budgeted["quality"]["fidelity"] >= 0.5 and len(budgeted["peek_seconds_per_round"]) == 2
    rounds = [12 * 2 / r for r in budgeted["tokens_per_second"]["rounds"]]  # 2 prompts x 12 tokens
    without = statistics.median(s - p for s, p in zip(rounds, budgeted["peek_seconds_per_round"]))
    assert budgeted["tokens_per_second_without_peek"] == pytest.approx(24 / without)
    assert "viasd_oracle_budget_vs_sd_model" in result["ratios_model"] and "viasd_oracle_budget_vs_sd" in result["ratios"]
    # beside every measured ratio its range over the rounds, each round's rates paired (an oracle's less its peeks)
    assert set(result["ratio_rounds"]) == set(result["ratios"])
    viasd_rounds, sd_rounds = (result["methods"][m]["tokens_per_second"]["rounds"] for m in ("viasd", "sd"))
    paired = sorted(v / s for v, s in zip(viasd_rounds, sd_rounds))
    assert result["ratio_rounds"]["viasd_vs_sd"] == pytest.approx({"min": paired[0], "median": statistics.median(paired),
                                                                   "max": paired[-1]})
    from viasd.stages.bench_stage import bench_record

    paths = bench_paths(params, "smoke", "stdlib_continuation")
    metrics = bench_record({**result, "files": paths}).metrics  # the MLflow run has the range beside each ratio
    assert metrics["ratio.viasd_vs_sd.round_min"] == result["ratio_rounds"]["viasd_vs_sd"]["min"]
    budget_rounds = [24 / (s - p) for s, p in zip(rounds, budgeted["peek_seconds_per_round"])]
    assert result["ratio_rounds"]["viasd_oracle_budget_vs_sd"]["max"] == pytest.approx(
        max(b / s for b, s in zip(budget_rounds, sd_rounds)))
    assert result["model_over_measured"]["sd_vs_ar"] > 0 and "loop:sd" in result["pass_cost_model"]
    for row in result["methods"].values():
        tps = row["tokens_per_second"]
        assert len(tps["rounds"]) == 2 and tps["min"] <= tps["median"] <= tps["max"]
        assert {"draft", "target"} <= set(row["forward_passes_per_token"])
    assert result["methods"]["ar"]["forward_passes_per_token"]["draft"] == 0
    # ar makes one target pass per token (the prefill pass included)
    assert result["methods"]["ar"]["forward_passes_per_token"]["target"] == pytest.approx(1.0)
    assert result["methods"]["hf_ar"]["forward_passes_per_token"]["target"] == pytest.approx(1.0)
    sd, viasd = result["methods"]["sd"]["forward_passes_per_token"], result["methods"]["viasd"]["forward_passes_per_token"]
    # the slim view's passes are its own, not the target's; none when the thresholds tuned in this folder (the
    # session's study folder may hold some) turned the tiers off
    from viasd.study.cells import tuned_settings

    tuned = tuned_settings(params, "smoke", "stdlib_continuation", required=False)
    tiers_off = str(tuned.get("tau_accept")) == "inf" and str(tuned.get("tau_slim")) == "inf"
    # a tuned draft gate may also send every block straight to the full model: no slim pass then either
    every_block_gated = result["methods"]["viasd"]["gated_rate"] == 1
    assert (viasd["slim"] > 0) == (not tiers_off and not every_block_gated) and "slim" not in sd
    fixed = result["methods"]["hf_assisted_fixed"]["forward_passes_per_token"]
    # a fixed schedule drafts gamma=3 tokens per round whatever the draft's confidence (fewer only near the
    # end), where the default schedule stops at the first unconfident token
    assert fixed["draft"] >= 2 * fixed["target"]
    assert {"ar_vs_hf_ar", "sd_vs_hf_assisted", "sd_vs_ar", "viasd_vs_sd", "viasd_vs_ar"} <= set(result["ratios"])
    assert set(result["efficiency"]) == {"sd", "cascade_sd", "spec_cascade", "viasd"}
    assert all({"measured_speedup", "ideal_speedup", "efficiency"} <= set(v) for v in result["efficiency"].values())
    assert result["best_hf_assisted"] in ("hf_assisted", "hf_assisted_fixed") and result["gamma"] == 3
    assert result["cache"] == "inplace"  # decode.cache, the default: no cache kind in the file name
    assert (result["device"], result["dtype"]) == ("cpu", "torch.float32")
    assert bench_paths(params, "smoke", "stdlib_continuation")["md"].read_text().startswith("# viasd bench")

    assert result["numerical_ties"] == []  # float32: the lossless methods make hf_ar's tokens exactly
    # quality beside every speed figure: lossless methods are the target's greedy output, token for token
    for name in ("hf_ar", "hf_assisted", "ar", "sd", "cascade_sd"):
        q = result["methods"][name]["quality"]
        assert q["fidelity"] == 1.0 and q["task_metric"] == "chrf" and q["task_drop"] == 0.0
    # in float32 greedy decoding an output equals ar's exactly where every token was the target's greedy choice
    # given its prefix: no differing output without a fidelity below 1, and none below 1 without one (spec_cascade
    # is lossy whatever the thresholds)
    for name, row in result["methods"].items():
        q = row["quality"]
        assert 0 <= q["outputs_differing"] <= result["prompts"]
        assert (q["outputs_differing"] == 0) == (q["fidelity"] == 1.0), name
    assert result["methods"]["spec_cascade"]["quality"]["outputs_differing"] > 0
    viasd_q = result["methods"]["viasd"]["quality"]
    assert f"| {viasd_q['outputs_differing']}/{result['prompts']} |" in \
        bench_paths(params, "smoke", "stdlib_continuation")["md"].read_text()
    assert {"viasd_vs_sd_model", "sd_vs_ar_model"} <= set(result["ratios_model"])
    assert {"draft:1", "target:4"} <= set(result["pass_cost_model"])  # sd's full passes of the 4-layer target

    # the GPU setting's dtype runs on the CPU too (same code path: cast weights, float32 logits)
    assert main(["bench", *base, "--prompts", "2", "--repeats", "1", "--max-new-tokens", "12", "--gamma", "3",
                 "--dtype", "bfloat16", "--methods", "hf_ar,ar,sd,viasd"]) == 0
    half = json.loads(bench_paths(params, "smoke", "stdlib_continuation", dtype="bfloat16")["json"].read_text())
    assert half["dtype"] == "torch.bfloat16" and set(half["methods"]) == {"hf_ar", "ar", "sd", "viasd"}
    assert all(t["logit_gap"] <= 2 * t["noise"] for t in half["numerical_ties"])
    names = bench_paths(params, "p", "t", "gamma", cache="static", compile=True, device="cuda:1", dtype="bfloat16")
    assert names["json"].name == "p-t-sweep-gamma-static-compiled-cuda-bfloat16.json"
    assert bench_paths(params, "p", "t", reuse=False)["json"].name == "p-t-no_reuse.json"  # decode.reuse is on

    assert main(["bench", *base, "--prompts", "1", "--repeats", "1", "--max-new-tokens", "8",
                 "--sweep", "gamma=1,2"]) == 0
    sweep = json.loads(bench_paths(params, "smoke", "stdlib_continuation", "gamma")["json"].read_text())
    assert [p["gamma"] for p in sweep["points"]] == [1, 2] and "sd" in sweep["points"][0]
    assert bench_paths(params, "smoke", "stdlib_continuation", "gamma")["png"].exists()
    for kind, values in (("length", [6, 12]), ("prompt", [16, 24])):
        assert main(["bench", *base, "--prompts", "1", "--repeats", "1", "--max-new-tokens", "6", "--methods", "ar,sd",
                     "--sweep", f"{kind}={values[0]},{values[1]}"]) == 0
        swept = json.loads(bench_paths(params, "smoke", "stdlib_continuation", kind)["json"].read_text())
        assert [p[kind] for p in swept["points"]] == values and swept["methods"] == ["ar", "sd"]
        assert all(p[m]["tokens_per_second"] > 0 for p in swept["points"] for m in ("ar", "sd"))
        assert bench_paths(params, "smoke", "stdlib_continuation", kind)["md"].read_text().count("\n| ") == 3  # header + 2 points
    assert main(["bench", *base, "--prompts", "1", "--repeats", "1", "--sweep", "position=8,16", "--cache", "static"]) == 0
    position = json.loads(bench_paths(params, "smoke", "stdlib_continuation", "position", "static")["json"].read_text())
    assert set(position["last_vs_first"]) == {"hf_ar", "ar"} and position["cache"] == "static"
    assert all(p["ar"]["ms_per_token"] > 0 for p in position["points"])
    assert main(["bench", *base, "--prompts", "1", "--repeats", "1", "--max-new-tokens", "8", "--sweep", "frontier"]) == 0
    front = json.loads(bench_paths(params, "smoke", "stdlib_continuation", "frontier")["json"].read_text())
    names = [p["name"] for p in front["points"]]
    assert names[:3] == ["ar", "sd", "viasd tuned"] and sum(n.startswith("viasd ta=") for n in names) == 50
    assert sum(n.endswith(" unchecked") for n in names) == 25
    assert sum(n.startswith("spec_cascade ") for n in names) == 5
    # the oracle (fidelity 1) and the budgeted oracle at the smoke floor (0.5), each timed without its peeks
    oracles = {p["name"]: p for p in front["points"] if p.get("router") == "oracle"}
    assert set(oracles) == {"viasd oracle", "viasd oracle at floor"} and oracles["viasd oracle"]["fidelity"] == 1.0
    assert oracles["viasd oracle at floor"]["fidelity"] >= 0.5
    assert all(p["fidelity"] == 1.0 for p in front["points"] if p["method"] in ("ar", "sd"))
    assert bench_paths(params, "smoke", "stdlib_continuation", "frontier")["png"].exists()
    capsys.readouterr()
    assert main(["bench", *base, "--sweep", "depth=1,2"]) == 2
    assert "unknown sweep 'depth'" in capsys.readouterr().err


def test_bench_refuses_a_speedup_when_outputs_differ(study):
    from viasd.benchmark import BenchError, BenchMethod, run_benchmark
    from viasd.decoding.policy import DecodePolicy
    from viasd.models import load_models

    _, params = study
    models = load_models(params.model_dir("target"), draft=params.model_dir("draft"), device="cpu")
    lossy = DecodePolicy(method="spec_cascade", alpha=50.0, gamma=3, max_new_tokens=10, eos_token_ids=())
    methods = [BenchMethod("hf_ar"), BenchMethod("sd", lossy)]  # a lossy rule posing as sd
    prompts = [list(range(5, 25)), list(range(30, 50))]
    with pytest.raises(BenchError, match="sd and hf_ar produced different tokens on prompt"):
        run_benchmark(models, prompts, methods, 10, repeats=1, progress=False)


def test_bench_rounds_interleave_the_methods_by_prompt():
    """A timed round runs every method on a prompt before the next prompt, in the orders of a Williams design:
    over n consecutive prompts (2n for odd n) each method runs in each place equally often and directly after
    each other method equally often, whichever prompt and round the run of prompts starts at."""
    from collections import Counter

    from viasd.benchmark import interleaved

    for n in (2, 3, 4, 5, 6):
        methods = [f"m{j}" for j in range(n)]
        span = n if n % 2 == 0 else 2 * n
        for r, start in ((0, 0), (1, 0), (2, 3)):
            orders = [interleaved(methods, r, i) for i in range(start, start + span)]
            assert all(sorted(o) == methods for o in orders)
            places = Counter((j, m) for o in orders for j, m in enumerate(o))
            assert set(places.values()) == {span // n}
            after = Counter((a, b) for o in orders for a, b in zip(o, o[1:]))
            assert len(after) == n * (n - 1) and set(after.values()) == {span // n}
    assert interleaved(["ar"], 1, 7) == ["ar"]
    assert interleaved(["ar", "sd", "viasd", "viasd_oracle"], 0, 0) == ["ar", "sd", "viasd_oracle", "viasd"]


def test_bench_accepts_only_numerical_ties():
    """A lossless method may part from the reference only where the target's two logits are equal to
    within its rounding noise: here an exact tie (the lm_head row of one token copied onto another),
    and a real difference (the runner-up token) that must be refused."""
    from types import SimpleNamespace

    import transformers as tf
    from tiny_models import config_for

    from viasd.benchmark import BenchError, check_outputs, tie_gap

    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config_for("llama", 2, 64, 0)).eval()
    prompt, ref = [5, 9, 3, 17, 22, 8], [11, 4]
    with torch.no_grad():
        z = model(input_ids=torch.tensor([prompt + ref[:1]])).logits[0, -1]
    top, runner_up = torch.topk(z, 2).indices.tolist()
    ref[1] = top
    gap, noise = tie_gap(model, prompt + ref[:1], top, runner_up)
    assert gap > 2 * noise and noise < 1e-4  # float32: distinct logits are far above the rounding noise
    models = SimpleNamespace(target=model)
    with pytest.raises(BenchError, match=r"sd and hf_ar produced different tokens on prompt 0 \(first at position 1; "
                                         r"the target's logits differ by"):
        check_outputs(models, [prompt], {"hf_ar": [ref], "sd": [[ref[0], runner_up]]})
    with torch.no_grad():
        model.lm_head.weight[runner_up] = model.lm_head.weight[top]
    ties = check_outputs(models, [prompt], {"hf_ar": [ref], "ar": [ref], "sd": [[ref[0], runner_up]]})
    assert [(t["method"], t["prompt"], t["position"], t["logit_gap"]) for t in ties] == [("sd", 0, 1, 0.0)]


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
