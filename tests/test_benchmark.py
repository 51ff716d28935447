"""viasd bench: the report's shape on the smoke family, the refusal of a speedup whose outputs differ, the
numerical-tie rule of the output check, and the balanced order of the timed rounds (and of the study's
side-by-side decodes)."""

import json
import statistics
from dataclasses import replace

import pytest
import torch
from workflow_helpers import REPO

REPO_PARAMS = REPO / "params.yaml"


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

    methods = ["hf_ar", "hf_assisted", "hf_assisted_fixed", "hf_assisted_heuristic", "ar", "sd", "self_sd", "cascade_sd",
               "spec_cascade", "viasd",
               "viasd-oracle", "viasd-oracle_budget"]
    # the hand rules' own tuned policy, when the session's study folder holds its search
    methods += ["viasd-rules"] if threshold_paths(params, "stdlib_continuation", "smoke", "rules")["json"].exists() else []
    assert set(result["methods"]) == set(methods) and all(m in out for m in methods)
    # the oracle: the target's greedy output, timed without its peeks (it reads the greedy outputs decoded before
    # the rounds) and modelled, and the share of its headroom viasd takes, each way; beside every ratio how close
    # the model is
    oracle = result["methods"]["viasd-oracle"]
    assert oracle["quality"]["fidelity"] == 1.0 and "tokens_per_second_without_peek" in oracle
    assert "viasd-oracle_vs_sd_model" in result["ratios_model"] and "viasd-oracle_vs_sd" in result["ratios"]
    assert result["ratios"]["viasd-oracle_vs_sd"] == pytest.approx(
        oracle["tokens_per_second_without_peek"] / result["methods"]["sd"]["tokens_per_second"]["median"])
    # the budgeted oracle at the search's fidelity floor (smoke: 0.5), its peeks taken off each timed round
    budgeted = result["methods"]["viasd-oracle_budget"]
    assert budgeted["quality"]["fidelity"] >= 0.5 and len(budgeted["peek_seconds_per_round"]) == 2
    rounds = [12 * 2 / r for r in budgeted["tokens_per_second"]["rounds"]]  # 2 prompts x 12 tokens
    without = statistics.median(s - p for s, p in zip(rounds, budgeted["peek_seconds_per_round"]))
    assert budgeted["tokens_per_second_without_peek"] == pytest.approx(24 / without)
    assert "viasd-oracle_budget_vs_sd_model" in result["ratios_model"] and "viasd-oracle_budget_vs_sd" in result["ratios"]
    # beside every measured ratio its range over the rounds, each round's rates paired (an oracle's less its peeks)
    assert set(result["ratio_rounds"]) == set(result["ratios"])
    viasd_rounds, sd_rounds = (result["methods"][m]["tokens_per_second"]["rounds"] for m in ("viasd", "sd"))
    paired = sorted(v / s for v, s in zip(viasd_rounds, sd_rounds))
    assert result["ratio_rounds"]["viasd_vs_sd"] == pytest.approx({"min": paired[0], "median": statistics.median(paired),
                                                                   "max": paired[-1]})
    from viasd.bench.command import bench_record

    paths = bench_paths(params, "smoke", "stdlib_continuation")
    metrics = bench_record({**result, "files": paths}).metrics  # the MLflow run has the range beside each ratio
    assert metrics["ratio.viasd_vs_sd.round_min"] == result["ratio_rounds"]["viasd_vs_sd"]["min"]
    budget_rounds = [24 / (s - p) for s, p in zip(rounds, budgeted["peek_seconds_per_round"])]
    assert result["ratio_rounds"]["viasd-oracle_budget_vs_sd"]["max"] == pytest.approx(
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
    assert result["best_hf_assisted"] in ("hf_assisted", "hf_assisted_fixed", "hf_assisted_heuristic") and \
        result["gamma"] == 3
    assert result["gamma_source"] == "--gamma"
    # per-prompt paired ratios with intervals clustered by source file (2 prompts: one file each, or one in all)
    intervals = result["intervals"]
    assert {"viasd_vs_sd", "sd_vs_ar", "viasd-oracle_vs_sd", "ar_vs_hf_ar"} <= set(intervals)
    for ratio in intervals.values():
        assert ratio["prompts"] == 2 and ratio["ratio"] > 0 and ratio["groups"] in (1, 2)
        assert ratio["low"] is None or ratio["low"] <= ratio["ratio"] <= ratio["high"]
    assert "geometric mean [95% CI]" in bench_paths(params, "smoke", "stdlib_continuation")["md"].read_text()
    assert metrics["interval.viasd_vs_sd.ratio"] == intervals["viasd_vs_sd"]["ratio"]
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
    # a draft tree's shape, chosen on dev: the tree's nodes swept beside the chain, accepted tokens per block beside speed
    assert main(["bench", *base, "--prompts", "1", "--repeats", "1", "--max-new-tokens", "8", "--gamma", "2",
                 "--split", "dev", "--tree-top-k", "2", "--sweep", "tree=2,4"]) == 0
    tree = json.loads(bench_paths(params, "smoke", "stdlib_continuation", "tree-depth2-top_k2", split="dev")["json"].read_text())
    assert tree["methods"] == ["ar", "sd", "sd-tree"] and [p["tree"] for p in tree["points"]] == [2, 4]
    assert tree["split"] == "dev" and tree["tree_top_k"] == 2
    assert all(p["sd-tree"]["accepted_per_block"] >= 0 and p["ar"]["accepted_per_block"] is None for p in tree["points"])
    assert all(p["intervals"]["sd-tree_vs_sd"]["ratio"] > 0 for p in tree["points"])  # paired, per point
    for kind, values in (("length", [6, 12]), ("prompt", [16, 24])):
        assert main(["bench", *base, "--prompts", "1", "--repeats", "1", "--max-new-tokens", "6", "--methods", "ar,sd",
                     "--sweep", f"{kind}={values[0]},{values[1]}"]) == 0
        swept = json.loads(bench_paths(params, "smoke", "stdlib_continuation", kind)["json"].read_text())
        assert [p[kind] for p in swept["points"]] == values and swept["methods"] == ["ar", "sd"]
        assert all(p[m]["tokens_per_second"] > 0 for p in swept["points"] for m in ("ar", "sd"))
        table, _, paired = bench_paths(params, "smoke", "stdlib_continuation", kind)["md"].read_text().partition("Paired")
        assert table.count("\n| ") == 3 and paired.count("\n| ") == 3  # header + 2 points, each table
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


def test_bench_batch_writes_throughput_against_batch_size(study, capsys):
    """`viasd bench --batch`: per batch size each method's tokens/s, latency and the ratios with intervals over
    rounds, quality beside them, a table, a plot and an MLflow record; bad sizes get one line."""
    from viasd.bench.sweeps import batch_record
    from viasd.cli import main
    from viasd.study.paths import bench_paths

    src_tmp, params = study
    base = ["--params", str(src_tmp / "params.yaml"), "--no-track"]
    assert main(["dimr-search", *base]) == 0
    assert main(["bench", *base, "--batch", "1,3", "--prompts", "3", "--repeats", "2", "--max-new-tokens", "8",
                 "--gamma", "3"]) == 0
    paths = bench_paths(params, "smoke", "stdlib_continuation", "batch")
    result = json.loads(paths["json"].read_text())
    assert result["batch_sizes"] == [1, 3] and result["methods"] == ["hf_ar", "ar", "sd", "viasd"]
    for row in result["rows"]:
        assert set(row["ratios"]) == {"ar_vs_hf_ar", "sd_vs_ar", "viasd_vs_sd", "viasd_vs_ar"}
        for r in row["ratios"].values():
            assert r["low"] <= r["ratio"] <= r["high"]  # two rounds: an interval
        assert all(len(m["rounds"]) == 2 and m["latency_s"] > 0 for m in row["methods"].values())
    assert result["rows"][0]["ar_vs_ar_batch_1"] == 1.0
    # each row decodes as its prompt alone, so the lossless methods keep fidelity 1 at batch 3
    assert result["quality"]["sd"]["fidelity"] == 1.0 and result["quality"]["ar"]["fidelity"] == 1.0
    assert paths["png"].exists() and "viasd_vs_sd" in paths["md"].read_text()
    record = batch_record({**result, "files": paths})
    assert "tokens_per_second.viasd.batch_3" in record.metrics and "fidelity.viasd" in record.metrics
    capsys.readouterr()
    assert main(["bench", *base, "--batch", "0,2"]) == 2
    assert "batch sizes of at least 1" in capsys.readouterr().err


def test_the_study_batch_table_stage(study, capsys, tmp_path):
    """`viasd batch-table`: the study's speed against batch size for its tuned policies, in its own folder, with the
    report's part (the answer, the table and the plot) read off it; without the study's searches it names the
    stage to run; `batch_table.sizes: []` writes that it is off and decodes nothing, and the report then has no
    such part."""
    import yaml
    from study_fixtures import smoke_params

    from viasd import config
    from viasd.cli import main
    from viasd.errors import StudyInputError
    from viasd.report.batch import batch_section
    from viasd.stages.batch_table import batch_table_record, run_batch_table_stage
    from viasd.stages.dimr_search import run_dimr_stage
    from viasd.stages.train_router import run_router_stage
    from viasd.stages.tune_thresholds import run_thresholds_stage
    from viasd.study.paths import batch_table_paths

    with pytest.raises(StudyInputError, match="run `viasd dimr-search --pair smoke` first"):
        run_batch_table_stage(config.load(smoke_params(tmp_path)), "smoke", "stdlib_continuation")
    src_tmp, study_params = study
    base = ["--params", str(src_tmp / "params.yaml"), "--no-track"]
    run_dimr_stage(study_params, progress=False)  # each resumes or finds itself done where another test ran it
    run_router_stage(study_params, progress=False)
    run_thresholds_stage(study_params, progress=False, slims=["rules", "main"])
    overlay = src_tmp / "batch-table.yaml"
    overlay.write_text(yaml.safe_dump({"batch_table": {"sizes": [1, 3], "prompts": 3, "max_new_tokens": 6,
                                                       "repeats": 2}}))
    args = [*base, "--config", str(overlay), "--pair", "smoke", "--task", "stdlib_continuation"]
    capsys.readouterr()
    assert main(["batch-table", *args]) == 0
    params = config.load(src_tmp / "params.yaml", [overlay])
    paths = batch_table_paths(params, "smoke", "stdlib_continuation")
    result = json.loads(paths["json"].read_text())
    assert result["batch_sizes"] == [1, 3] and result["prompts"] == 3 and result["max_new_tokens"] == 6
    assert result["methods"] == ["hf_ar", "ar", "sd", "viasd"] and result["title"].startswith("viasd batch-table")
    assert all(r["low"] <= r["ratio"] <= r["high"] for row in result["rows"] for r in row["ratios"].values())
    assert result["quality"]["sd"]["fidelity"] == 1.0 and paths["png"].exists()
    assert "viasd_vs_sd" in paths["md"].read_text()
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [p["batch"] for p in printed] == [1, 3]
    record = batch_table_record(params, "smoke", "stdlib_continuation", {**result, "files": paths})
    assert record.stage == "batch_table" and "interval.viasd_vs_sd.batch_3.low" in record.metrics
    section = "\n".join(batch_section(result, "batch/smoke/stdlib_continuation/batch.png"))
    assert "VIA-SD over SD: batch 1: " in section and "batch 3: " in section
    assert "![batch](batch/smoke/stdlib_continuation/batch.png)" in section
    assert section.count("| 3 |") == 2  # the speed table's row and the passes table's row at batch 3
    # off: a file that says so, nothing decoded, nothing in the report
    overlay.write_text(yaml.safe_dump({"batch_table": {"sizes": []}}))
    assert main(["batch-table", *args]) == 0
    off = json.loads(paths["json"].read_text())
    assert off["off"] is True and not off["unsupported"] and off["rows"] == [] and batch_section(off, "x.png") == []


def test_batch_table_settings_are_checked_against_the_prompts():
    """A batch larger than the table's prompts, or more prompts than a task's test split holds, is one clear error."""
    from viasd import config

    raw = config.resolve(REPO_PARAMS)
    for table, message in (({"sizes": [1, 32], "prompts": 16}, "batch_table.sizes: batch 32 needs at least as many"),
                           ({"sizes": [1, 4], "prompts": 64}, "batch_table.prompts: 64, but tasks.")):
        with pytest.raises(config.ConfigError, match=message):
            config.validate(config.deep_merge(raw, {"batch_table": table}), "params.yaml")


def test_bench_refuses_a_speedup_when_outputs_differ(study):
    from viasd.bench.methods import BenchError, BenchMethod
    from viasd.bench.timing import run_benchmark
    from viasd.decoding.policy import DecodePolicy
    from viasd.models import load_models

    _, params = study
    models = load_models(params.model_dir("target"), draft=params.model_dir("draft"), device="cpu")
    lossy = DecodePolicy(method="spec_cascade", alpha=50.0, gamma=3, max_new_tokens=10, eos_token_ids=())
    methods = [BenchMethod("hf_ar"), BenchMethod("sd", lossy)]  # a lossy rule posing as sd
    prompts = [list(range(5, 25)), list(range(30, 50))]
    with pytest.raises(BenchError, match="sd and hf_ar produced different tokens on prompt"):
        run_benchmark(models, prompts, methods, 10, repeats=1, progress=False)


def _assert_balanced(orders: list[list], methods: list) -> None:
    """Over these consecutive orders each method runs in each place, and directly after each other method,
    equally often (a Williams design's balance)."""
    from collections import Counter

    n = len(methods)
    assert all(sorted(o, key=str) == sorted(methods, key=str) for o in orders)
    places = Counter((j, m) for o in orders for j, m in enumerate(o))
    assert len(places) == n * n and set(places.values()) == {len(orders) // n}
    after = Counter((a, b) for o in orders for a, b in zip(o, o[1:]))
    assert len(after) == n * (n - 1) and set(after.values()) == {len(orders) // n}


def test_bench_rounds_interleave_the_methods_by_prompt():
    """A timed round runs every method on a prompt before the next prompt, in the orders of a Williams design:
    over n consecutive prompts (2n for odd n) each method runs in each place equally often and directly after
    each other method equally often, whichever prompt and round the run of prompts starts at."""
    from viasd.evaluation.run_order import interleaved

    for n in (2, 3, 4, 5, 6):
        methods = [f"m{j}" for j in range(n)]
        span = n if n % 2 == 0 else 2 * n
        for r, start in ((0, 0), (1, 0), (2, 3)):
            _assert_balanced([interleaved(methods, r, i) for i in range(start, start + span)], methods)
    assert interleaved(["ar"], 1, 7) == ["ar"]
    assert interleaved(["ar", "sd", "viasd", "viasd-oracle"], 0, 0) == ["ar", "sd", "viasd-oracle", "viasd"]


class _Logged:
    """A ModelSet that writes the name of each run it decodes for into a shared log (what it decodes is the model
    set's own: every call goes through)."""

    def __init__(self, models, name, log):
        self._models, self._name, self._log = models, name, log

    def generate(self, prompt, policy, **kw):
        self._log.append((self._name, "oracle_reference" in kw))
        return self._models.generate(prompt, policy, **kw)

    def __getattr__(self, attr):
        return getattr(self._models, attr)


def test_study_decodes_side_by_side_in_the_benchs_balanced_order(model_sets, tokenizer):
    """The decode stage takes its runs' turns on each prompt in a balanced order (`ar` and the oracle among them):
    over 8 prompts each of the 4 runs in each place, and right after each other run, twice; the oracle peeks for
    itself (its peeks timed apart) instead of reading `ar`'s output; the warm-up comes first."""
    from viasd import DecodePolicy
    from viasd.evaluation.side_by_side import decode_side_by_side
    from viasd.tasks.base import Example

    models = model_sets("llama")
    log: list = []
    policy = DecodePolicy(gamma=3, max_new_tokens=6, eos_token_ids=())
    cells = {name: (_Logged(models, name, log), replace(policy, **kw)) for name, kw in
             (("sd", {"method": "sd"}), ("viasd", {"method": "viasd"}), ("oracle", {"method": "viasd", "router": "oracle"}))}
    examples = [Example(id=str(i), prompt=f"def f{i}(x):\n", reference="") for i in range(8)]
    rows, _, ref_rows, _ = decode_side_by_side(_Logged(models, None, log), replace(policy, method="ar"), cells, examples,
                                               progress=False, warmup_tokens=2)
    assert log[:4] == [(None, False), ("sd", False), ("viasd", False), ("oracle", False)]  # the warm-up
    turns = list(zip(*[iter(log[4:])] * 4))  # per prompt: the 4 runs
    assert len(turns) == 8 and not any(ref for t in turns for _, ref in t)
    _assert_balanced([[name for name, _ in t] for t in turns], [None, "sd", "viasd", "oracle"])
    assert [r["token_ids"] for r in rows["oracle"]] == [r["token_ids"] for r in ref_rows]
    assert all(r["stats"]["peek_passes"] > 0 and r["ar_new_tokens"] == len(r["ar_token_ids"]) for r in rows["oracle"])
    assert all(0 < r["ar_decode_time_s"] <= r["ar_wall_time_s"] for r in rows["sd"])


def test_bench_accepts_only_numerical_ties():
    """A lossless method may part from the reference only where the target's two logits are equal to
    within its rounding noise: here an exact tie (the lm_head row of one token copied onto another),
    and a real difference (the runner-up token) that must be refused."""
    from types import SimpleNamespace

    import transformers as tf
    from tiny_models import config_for

    from viasd.bench.timing import BenchError, check_outputs, tie_gap

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
