"""DIMR mask search on the smoke family: cost maths by hand, the stage's outputs and no-op re-run, a real
kill-and-resume, and clear errors for impossible budgets and missing calibration."""

import json
import math

import pytest
import torch
from search_helpers import complete_trials, kill_after_trials
from study_fixtures import smoke_params

from viasd import config, load_models
from viasd.decoding.slim import RoutingMask
from viasd.search.calibration_set import CalibrationError, load_calibration
from viasd.search.dimr import MaskCost, SearchError, top_k_mask
from viasd.search.mask_cost import kl, position_costs
from viasd.stages.dimr_search import run_dimr_stage
from viasd.study.paths import mask_paths


def test_kl_by_hand():
    p = torch.tensor([0.5, 0.5]).log()
    q = torch.tensor([0.25, 0.75]).log()
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert kl(p, q).item() == pytest.approx(expected)
    assert kl(p, p).item() == 0.0
    u = torch.tensor([0.4, 0.6]).log()
    assert position_costs("path", p, u, q).item() == pytest.approx((kl(p, u) + kl(u, q)).item())
    assert position_costs("target", p, u, q).item() == pytest.approx(kl(q, u).item())
    with pytest.raises(ValueError):
        position_costs("nope", p, u, q)


def test_top_k_mask():
    assert top_k_mask([0.1, 0.9, 0.5, 0.9], 2) == [1, 3]
    assert top_k_mask([0.3, 0.3, 0.3], 1) == [0]


def test_full_mask_has_zero_target_cost(study):
    _, params = study
    models = load_models(params.model_dir("target"), draft=params.model_dir("draft"), device="cpu")
    calibration = load_calibration(params.data.dir / "calibration.parquet")
    cost = MaskCost(models.target, models.draft, calibration, models.vocab_size, "target", 4)
    n = params.family.target.layers
    assert cost(RoutingMask.from_layers(list(range(n)), n)) == pytest.approx(0.0, abs=1e-6)
    assert cost(RoutingMask.from_layers([0], n)) > 0
    passes = cost.passes
    cost(RoutingMask.from_layers([0], n))  # memoised
    assert cost.passes == passes


def test_dimr_stage_outputs_and_noop_rerun(study):
    _, params = study
    out = run_dimr_stage(params, progress=False)
    paths = mask_paths(params)
    for key in ("mask", "trace", "storage", "curve", "layers", "random", "truncate", "every_other"):
        assert paths[key].exists(), key
    assert len(out["keep_layers"]) == round(0.5 * params.family.target.layers)
    assert out["cost"] <= out["best_random_cost"]
    trace = [json.loads(line) for line in paths["trace"].read_text().splitlines()]
    assert len(trace) == out["trials"] == 8 and {t["phase"] for t in trace} == {"random", "bayes"}
    for name in ("random", "truncate", "every_other"):
        baseline = json.loads(paths[name].read_text())
        assert len(baseline["keep_layers"]) == out["budget_layers"] and baseline["cost"] > 0
    assert json.loads(paths["truncate"].read_text())["keep_layers"] == [0, 1]
    mtime = paths["mask"].stat().st_mtime_ns
    again = run_dimr_stage(params, progress=False)
    assert again == {**out, "up_to_date": True} and paths["mask"].stat().st_mtime_ns == mtime
    models = load_models(params.model_dir("target"), draft=params.model_dir("draft"), masks=[paths["mask"]],
                         device="cpu")
    assert list(models.slims[0].mask.keep_layers) == out["keep_layers"]


def test_killed_search_resumes_without_losing_or_repeating_trials(study, tmp_path):
    _, params = study
    override = {"data": {"dir": str(params.data.dir)}, "models": {"dir": str(params.models_dir)},
                "dimr": {"n_random": 40, "n_bayes": 20, "cost": "target"}}
    path = smoke_params(tmp_path, override)
    resumed = config.load(path)
    paths = mask_paths(resumed)
    for key in ("mask", "storage"):
        paths[key].unlink(missing_ok=True)
    storage = f"sqlite:///{paths['storage']}"
    kill_after_trials(["dimr-search", "--params", str(path)], paths["storage"], 5)
    before = {t.number: t.user_attrs["keep_layers"] for t in complete_trials(storage, "dimr-smoke")}
    assert 5 <= len(before) < 60 and not paths["mask"].exists()
    out = run_dimr_stage(resumed, progress=False)
    after = complete_trials(storage, "dimr-smoke")
    assert len(after) == out["trials"] == 60  # none lost, none run twice
    assert all(t.user_attrs["keep_layers"] == before[t.number] for t in after if t.number in before)
    assert out["forward_passes"] <= (60 - len(before)) * math.ceil(resumed.data.calibration_sequences / 4)


def test_impossible_budget_and_missing_calibration(study, tmp_path):
    _, params = study
    with pytest.raises(SearchError, match="no mask meets that budget"):
        run_dimr_stage(params, progress=False, keep_ratio=0.05)
    empty = config.load(smoke_params(tmp_path, {"data": {"dir": str(tmp_path / "nodata")},
                                                "models": {"dir": str(tmp_path / "nomodels")}}))
    with pytest.raises(CalibrationError, match="does not exist"):
        run_dimr_stage(empty, progress=False)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"input_ids": pa.array([], type=pa.list_(pa.int64()))}), tmp_path / "empty.parquet")
    with pytest.raises(CalibrationError, match="is empty"):
        load_calibration(tmp_path / "empty.parquet")
