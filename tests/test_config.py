"""params.yaml is validated against the schema; every error names the key."""

import pytest
import yaml
from study_fixtures import REPO, smoke_params

from viasd import config
from viasd.config import ConfigError


def test_default_and_smoke_parse():
    default = config.load(REPO / "params.yaml")
    assert default.family.name == "default" and default.family.target.layers == 12
    smoke = config.load(REPO / "params.yaml", [REPO / "config" / "smoke.yaml"])
    assert smoke.family.name == "smoke" and smoke.data.max_files == 60
    # config/drafters.yaml: the default grid and the other drafters' two runs each, kept in step with params.yaml
    drafters = config.load(REPO / "params.yaml", [REPO / "config" / "drafters.yaml"])
    assert list(drafters.study.runs) == [*default.study.runs, "sd-drafter_feature", "viasd-drafter_feature",
                                         "sd-drafter_self", "viasd-drafter_self"]
    assert drafters.self_drafter.keep_layers(default.family.target.layers) == [0, 1, 2, 3]
    assert default.family.feature_drafter.trunk_layers == 6 and smoke.family.feature_drafter.trunk_layers == 1


@pytest.mark.parametrize("override,needle", [
    ({"models": {"families": {"smoke": {"target": {"layers": "four"}}}}},
     "models.families.smoke.target.layers: 'four' is not of type 'integer'"),
    ({"models": {"families": {"smoke": {"target": {"hidden": 65}}}}}, "hidden 65 is not divisible by heads"),
    ({"models": {"family": "huge"}}, "models.family: 'huge' is not one of models.families"),
    ({"data": {"split": {"train": 0.9}}}, "data.split: the fractions add up to"),
    ({"tasks": {"poetry": {"dev_prompts": 1}}}, "tasks.poetry: unknown task"),
    ({"thresholds": {"confirm_prompts": 3}}, "tasks.stdlib_continuation.dev_prompts: 4 dev prompts, but the threshold "
                                             "search decodes thresholds.dev_prompts + confirm_prompts = 5"),
    ({"train": {"batch_size": 0}}, "train.batch_size: 0 is less than the minimum of 1"),
    ({"models": {"families": {"smoke": {"feature_drafter": {"trunk_layers": 4}}}}},
     "feature_drafter.trunk_layers: 4 is not fewer than the target's 4 layers"),
    ({"train": {"bogus": 1}}, "Additional properties are not allowed ('bogus' was unexpected)"),
])
def test_malformed_params_name_the_key(tmp_path, override, needle):
    path = smoke_params(tmp_path, override)
    with pytest.raises(ConfigError) as err:
        config.load(path)
    assert needle in str(err.value)


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.load(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text(yaml.safe_dump(3))
    with pytest.raises(ConfigError, match="mapping"):
        config.load(scalar)


def test_schema_enums_agree_with_the_code():
    """Every choice the schema lists is one the code knows, and every one the code knows is listed (the
    schema checks params.yaml before anything is imported; the registries are what the code runs)."""
    from viasd.config import KNOWN_TASKS, SCHEMA, DecodeParams
    from viasd.decoding.policy import CACHE_KINDS, DEFAULT_CACHE, ROUTERS, SPEC_CASCADE_RULES
    from viasd.decoding.tiers import CONFIDENCES, SCORES
    from viasd.search.dimr import BASELINES
    from viasd.search.mask_cost import COSTS
    from viasd.tasks.builtin import BUILTIN
    from viasd.tasks.hub import HUB_TASKS

    schema = yaml.safe_load(SCHEMA.read_text())["properties"]
    decode, dimr, thresholds = (schema[k]["properties"] for k in ("decode", "dimr", "thresholds"))
    assert decode["cache"]["enum"] == list(CACHE_KINDS) and DecodeParams().cache == DEFAULT_CACHE
    assert decode["spec_cascade"]["properties"]["rule"]["enum"] == list(SPEC_CASCADE_RULES)
    assert set(dimr["cost"]["enum"]) == set(COSTS) and dimr["baselines"]["items"]["enum"] == list(BASELINES)
    assert set(thresholds["scores"]["items"]["enum"]) == set(SCORES)
    assert set(thresholds["confidences"]["items"]["enum"]) == set(CONFIDENCES)
    # the search chooses between the rules and the learned router; the oracle is a run of its own
    assert thresholds["routers"]["items"]["enum"] == [r for r in ROUTERS if r != "oracle"]
    assert set(KNOWN_TASKS) == set(BUILTIN) | set(HUB_TASKS)
