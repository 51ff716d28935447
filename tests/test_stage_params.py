"""Each stage's parameter slice as a file (`study.stage_params`): rewritten only when a value in it changes, so
Snakemake re-runs what an edit touches and takes what DVC or a person ran for current."""

from __future__ import annotations

import copy
import os

from workflow_helpers import REPO

from viasd import config
from viasd.study.stage_params import record_stage_params, stage_params_path


def _touch_back(path, seconds=100):
    """Set the folder `path`'s time `seconds` into the past, so a rewrite would show."""
    t = path.stat().st_mtime - seconds
    os.utime(path, (t, t))
    return path.stat().st_mtime


def test_a_slice_is_rewritten_only_when_its_values_change(tmp_path):
    cfg = config.resolve(REPO / "params.yaml")
    decode = record_stage_params(cfg, "decode", tmp_path, pair="default", task="stdlib_continuation")
    search = record_stage_params(cfg, "tune_thresholds", tmp_path, pair="default", task="stdlib_continuation")
    test_prompts = record_stage_params(cfg, "prepare_task", tmp_path, task="stdlib_continuation", split="test")
    dev_prompts = record_stage_params(cfg, "prepare_task", tmp_path, task="stdlib_continuation", split="dev")
    assert decode == stage_params_path("decode", tmp_path, pair="default", task="stdlib_continuation")
    assert decode == tmp_path / ".viasd" / "params" / "decode" / "default-stdlib_continuation"  # Snakemake's input
    times = {p: _touch_back(p) for p in (decode, search, test_prompts, dev_prompts)}

    same = copy.deepcopy(cfg)
    for path, rule, wildcards in [(decode, "decode", {"pair": "default", "task": "stdlib_continuation"}),
                                  (dev_prompts, "prepare_task", {"task": "stdlib_continuation", "split": "dev"})]:
        record_stage_params(same, rule, tmp_path, **wildcards)
        assert path.stat().st_mtime == times[path]  # the same values: the file and its time stay

    edited = copy.deepcopy(cfg)
    edited["decode"]["gamma"] += 1
    edited["tasks"]["stdlib_continuation"]["test_prompts"] -= 1
    for _, rule, wildcards in [(decode, "decode", {"pair": "default", "task": "stdlib_continuation"}),
                                  (search, "tune_thresholds", {"pair": "default", "task": "stdlib_continuation"}),
                                  (test_prompts, "prepare_task", {"task": "stdlib_continuation", "split": "test"}),
                                  (dev_prompts, "prepare_task", {"task": "stdlib_continuation", "split": "dev"})]:
        record_stage_params(edited, rule, tmp_path, **wildcards)
    # the decode reads decode.gamma, the test prompts their count; the search and the dev prompts neither
    assert decode.stat().st_mtime > times[decode]
    assert f'"gamma": {edited["decode"]["gamma"]}' in (decode / "params.json").read_text()
    assert test_prompts.stat().st_mtime > times[test_prompts]
    assert search.stat().st_mtime == times[search] and dev_prompts.stat().st_mtime == times[dev_prompts]
    assert [p.name for p in decode.iterdir()] == ["params.json"]  # no temporary file left


def test_the_self_drafter_is_in_the_slices_only_of_grids_that_draft_with_it(tmp_path):
    """`models.self_drafter` is read by the router, search and decode stages only where a `drafter_self` run is in
    the grid: without one their slices leave it out (editing it re-runs nothing); with one, an edit re-runs those
    three and not the DIMR search. The router's slice also names the viasd-drafter runs it fits routers for."""
    from viasd.study.stage_params import stage_params

    cfg = config.resolve(REPO / "params.yaml")
    rules = {"train_router": {"pair": "default"}, "tune_thresholds": {"pair": "default", "task": "stdlib_continuation"},
             "decode": {"pair": "default", "task": "stdlib_continuation"}, "dimr_search": {"pair": "default"}}
    for rule, wildcards in rules.items():
        assert "self_drafter" not in stage_params(cfg, rule, **wildcards)
        assert "drafters" not in stage_params(cfg, rule, **wildcards)
    drafted = copy.deepcopy(cfg)
    drafted["study"]["runs"] = [*cfg["study"]["runs"], "sd-drafter_self", "viasd-drafter_self"]
    folders = {rule: record_stage_params(drafted, rule, tmp_path, **w) for rule, w in rules.items()}
    assert stage_params(drafted, "train_router", pair="default")["drafters"] == ["viasd-drafter_self"]
    times = {rule: _touch_back(path) for rule, path in folders.items()}
    drafted["models"]["self_drafter"] = {"layers": 3}
    for rule, wildcards in rules.items():
        record_stage_params(drafted, rule, tmp_path, **wildcards)
    assert {rule for rule, path in folders.items() if path.stat().st_mtime > times[rule]} == {
        "train_router", "tune_thresholds", "decode"}


def test_the_mask_search_reads_only_the_runs_that_need_a_search_of_their_own():
    """Adding a drafter or a baseline run to the grid leaves the DIMR search's slice (and so the search and every
    stage after it) as it was; a cost or prefix ablation, which needs its own search, changes it."""
    from viasd.study.stage_params import stage_params

    cfg = config.resolve(REPO / "params.yaml")
    before = {rule: stage_params(cfg, rule, pair="default") for rule in ("dimr_search", "dimr_worker")}
    grown = copy.deepcopy(cfg)
    grown["study"]["runs"] = [*cfg["study"]["runs"], "sd-drafter_self", "viasd-drafter_self", "sd-gamma_6"]
    assert {rule: stage_params(grown, rule, pair="default") for rule in before} == before
    assert before["dimr_search"]["searches"] == ["cost_target"]  # the default grid's cost ablation
    searched = copy.deepcopy(cfg)
    searched["study"]["runs"] = [*cfg["study"]["runs"], "viasd-prefix_2"]
    for rule in before:
        assert stage_params(searched, rule, pair="default")["searches"] == ["cost_target", "prefix_2"]


def test_dvc_lists_the_decode_keys_the_batch_table_reads():
    """The batch table's slice of `decode` and its DVC stage's params name the same keys, so the two engines re-run
    it on the same edits."""
    import yaml

    from viasd.study.stage_params import BATCH_TABLE_DECODE

    listed = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["batch_table"]["params"]
    assert {p.removeprefix("decode.") for p in listed if p.startswith("decode.")} == set(BATCH_TABLE_DECODE)
