"""Threshold searches split into parts (`thresholds.split_searches`): each search of the stage run whole by a
process of its own, the serial stage after them choosing as it would alone; a part that has nothing to search,
and the one clear error for a part with workers."""

import json

import optuna
import pytest
from search_helpers import check_the_choice
from study_fixtures import smoke_params

from viasd import config
from viasd.stages.dimr_search import run_dimr_stage
from viasd.stages.train_router import run_router_stage
from viasd.stages.tune_thresholds import run_thresholds_stage
from viasd.study.paths import threshold_paths


def test_split_searches_run_the_serial_stages_trials_and_leave_it_the_choice(study, tmp_path):
    """`thresholds.split_searches`: each search of the stage run whole by a process of its own (`--search`,
    a `PART`): the first (the hand rules') alone, then the others from it. The parts write nothing; the serial
    stage after them finds every study complete, runs no trial, and chooses as it would have alone; the
    seeded trials are the serial stage's own (a fresh serial run proposes the same points)."""
    from viasd.search.workers import PART

    _, params = study
    run_dimr_stage(params, progress=False)
    run_router_stage(params, progress=False)
    # a budget no other test uses: studies and outputs of their own
    split = config.load(smoke_params(tmp_path, {"data": {"dir": str(params.data.dir)},
                                                "models": {"dir": str(params.models_dir)},
                                                "thresholds": {"n_trials": 5, "rules_trials": 4}}))
    slims = ["rules", "main", "mask_random", "independent"]
    paths = {slim: threshold_paths(split, "stdlib_continuation", slim=slim) for slim in slims}

    def clear():
        for p in paths.values():
            for key in ("json", "trace", "plot", "storage"):
                p[key].unlink(missing_ok=True)

    def studies() -> dict[str, list]:
        out = {}
        for slim in slims:
            storage = f"sqlite:///{paths[slim]['storage']}"
            (name,) = optuna.get_all_study_names(storage)
            out[slim] = [(t.number, t.state, t.params) for t in optuna.load_study(study_name=name, storage=storage).trials]
        return out

    clear()
    try:
        with pytest.raises(config.ConfigError, match="--search nosuch: the searches of this stage are rules, main, "):
            run_thresholds_stage(split, progress=False, worker=PART, search="nosuch")
        for search in slims:  # the first, then the others (a workflow runs these side by side)
            run_thresholds_stage(split, progress=False, worker=PART, search=search)
            assert not any(p["json"].exists() or p["trace"].exists() for p in paths.values())
            assert paths[search]["storage"].exists()
        parts = studies()
        assert [len(parts[s]) for s in slims] == [4, 5, 3, 3]
        results = run_thresholds_stage(split, progress=False)
        assert studies() == parts  # the serial stage ran no trial of its own
        assert list(results) == slims and [results[s]["trials"] for s in slims] == [4, 5, 3, 3]
        for slim, result in results.items():
            check_the_choice(result, [json.loads(line) for line in paths[slim]["trace"].read_text().splitlines()])
            assert result["confirm"]["prompts"] == 2  # the held-out check ran in the serial stage
        assert results["main"]["oracle"] is not None
        # the same seeds as the serial stage: its random start-up trials (4 of each) propose the same points, and
        # the ablation starts from the rules' feasible trials
        clear()
        serial = run_thresholds_stage(split, progress=False)
        again = studies()
        for slim in ("rules", "main"):
            assert [t[2] for t in again[slim][:4]] == [t[2] for t in parts[slim][:4]]
        rules_points = [t[2] for t in parts["rules"]]
        assert all(t[2] in rules_points for t in parts["mask_random"])
        assert list(serial) == slims
    finally:
        clear()


def test_a_search_part_of_a_slim_with_the_dimr_mask_runs_nothing(study, monkeypatch):
    """A slim ablation whose mask is the DIMR mask takes main's result (in the serial stage): its part
    loads no model and runs no search."""
    from viasd.search.workers import PART
    from viasd.stages import tune_thresholds as thresholds_stage
    from viasd.study.slims import slim_description

    _, params = study
    run_dimr_stage(params, progress=False)
    real = slim_description
    main_mask = real(params, "smoke", thresholds_stage.slim_spec("main"))
    monkeypatch.setattr(thresholds_stage, "slim_description",
                        lambda p, pair, spec: main_mask if spec.ablation == "mask_random" else real(p, pair, spec))
    monkeypatch.setattr(thresholds_stage, "load_run_models", lambda *a, **k: pytest.fail("a model was loaded"))
    assert run_thresholds_stage(params, progress=False, worker=PART, search="mask_random") == {}


def test_a_search_part_with_a_worker_is_one_clear_error(capsys):
    from workflow_helpers import REPO

    from viasd.cli import main

    code = main(["tune-thresholds", "--params", str(REPO / "params.yaml"), "--no-track", "--worker", "1",
                 "--search", "main"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == ("viasd: error: --search and --worker: a search's part runs it alone; "
                                         "its trials are not shared")
