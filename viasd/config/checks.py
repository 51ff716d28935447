"""The checks of `params.yaml` that the schema cannot state: ones that relate two keys (a run's drafter and
`study.drafters`, the self-drafter's depth and the DIMR slim's, the search's prompts and a task's dev set) or
read the disk (a hub pair's local directory). Each failure is one `ConfigError` naming the file and the key."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .sections import SelfDrafterParams

KNOWN_TASKS = ("stdlib_continuation", "stdlib_functions", "humaneval", "cnn_dailymail", "xsum", "wmt14_de_en", "gsm8k",
               "natural_questions", "openai_humaneval")


def check_semantics(raw: dict, source: str) -> None:
    split = raw["data"]["split"]
    if abs(sum(split.values()) - 1.0) > 1e-6:
        raise ConfigError(f"{source}: data.split: the fractions add up to {sum(split.values()):g}, not 1")
    models = raw["models"]
    if models["family"] not in models["families"]:
        raise ConfigError(f"{source}: models.family: {models['family']!r} is not one of models.families "
                          f"({', '.join(models['families'])})")
    for name, fam in models["families"].items():
        drafter = fam.get("feature_drafter")
        if drafter and drafter["trunk_layers"] >= fam["target"]["layers"]:
            raise ConfigError(f"{source}: models.families.{name}.feature_drafter.trunk_layers: {drafter['trunk_layers']} "
                              f"is not fewer than the target's {fam['target']['layers']} layers")
        for role in ("target", "draft", "independent"):
            arch = fam[role]
            if arch["hidden"] % arch["heads"]:
                raise ConfigError(f"{source}: models.families.{name}.{role}: hidden {arch['hidden']} is not "
                                  f"divisible by heads {arch['heads']}")
            if arch["heads"] % arch.get("kv_heads", arch["heads"]):
                raise ConfigError(f"{source}: models.families.{name}.{role}.kv_heads must divide heads")
            exit_layer = arch.get("early_exit_layer")
            if exit_layer is not None and exit_layer >= arch["layers"]:
                raise ConfigError(f"{source}: models.families.{name}.{role}.early_exit_layer: {exit_layer} is not "
                                  f"below the model's {arch['layers']} layers (the exit reads layers 0..n-1)")
    for task in raw["tasks"]:
        if task not in KNOWN_TASKS:
            raise ConfigError(f"{source}: tasks.{task}: unknown task; known tasks: {', '.join(KNOWN_TASKS)}")
    hub = models.get("hub_pairs") or {}
    clash = set(hub) & set(models["families"])
    if clash:
        raise ConfigError(f"{source}: models.hub_pairs.{sorted(clash)[0]}: the name is also a family in models.families")
    for name, spec in hub.items():
        for role in ("target", "draft", "independent"):
            value = spec.get(role)
            if value and value.startswith(("/", ".", "~")) and not Path(value).expanduser().exists():
                raise ConfigError(f"{source}: models.hub_pairs.{name}.{role}: no model directory at {value}")
    study = raw["study"]
    pairs = [models["family"], *hub]
    for i, pair in enumerate(study["pairs"]):
        if pair not in pairs:
            raise ConfigError(f"{source}: study.pairs.{i}: {pair!r} is neither models.family nor one of models.hub_pairs"
                              f" ({', '.join(pairs)})")
    search = raw.get("thresholds", {})
    needed = search.get("dev_prompts", 0) + search.get("confirm_prompts", 0)
    for i, task in enumerate(study["tasks"]):
        if task not in raw["tasks"]:
            raise ConfigError(f"{source}: study.tasks.{i}: {task!r} has no entry under tasks")
        have = raw["tasks"][task].get("dev_prompts")
        if have is not None and have < needed:
            raise ConfigError(f"{source}: tasks.{task}.dev_prompts: {have} dev prompts, but the threshold search "
                              f"decodes thresholds.dev_prompts + confirm_prompts = {needed}")
    _check_batch_table(raw, source)
    from ..decoding.tier_router import floor_budget
    from ..study.runs import parse_run

    for i, run in enumerate(study["runs"]):
        try:
            spec = parse_run(run)
        except ValueError as err:
            raise ConfigError(f"{source}: study.runs.{i}: {err}") from None
        if spec.ablation == "independent":
            for pair in study["pairs"]:
                if pair in hub and not hub[pair].get("independent"):
                    raise ConfigError(f"{source}: study.runs.{i}: {run!r} needs an independent model, and "
                                      f"models.hub_pairs.{pair}.independent is not set")
        if spec.drafter == "self" and models["family"] in study["pairs"]:
            _check_self_drafter(raw, source, i, run, spec.method)
        if spec.drafter not in ("model", "self") and spec.drafter not in study.get("drafters", []):
            raise ConfigError(f"{source}: study.runs.{i}: {run!r} drafts with the {spec.drafter} drafter: add "
                              f"{spec.drafter} to study.drafters (its training stage)")
        floor = ((raw.get("thresholds") or {}).get("quality") or {}).get("min_fidelity")
        if spec.ablation == "oracle_budget" and floor_budget(floor) is None:
            raise ConfigError(f"{source}: study.runs.{i}: {run!r} spends the fidelity budget down to "
                              f"thresholds.quality.min_fidelity, which is {floor}: set a floor below 1")


def _check_batch_table(raw: dict, source: str) -> None:
    """The batch table decodes its prompts from each task's test split, at batch sizes up to their number."""
    table = raw.get("batch_table") or {}
    sizes, prompts = table.get("sizes") or [], table.get("prompts", 16)
    if not sizes:
        return
    if max(sizes) > prompts:
        raise ConfigError(f"{source}: batch_table.sizes: batch {max(sizes)} needs at least as many prompts, and "
                          f"batch_table.prompts is {prompts}")
    for task in raw["study"]["tasks"]:
        have = raw["tasks"].get(task, {}).get("test_prompts")
        if have is not None and have < prompts:
            raise ConfigError(f"{source}: batch_table.prompts: {prompts}, but tasks.{task}.test_prompts is {have}")


def _check_self_drafter(raw: dict, source: str, i: int, run: str, method: str) -> None:
    """The family's self-drafter (`models.self_drafter`) is shallower than its target and, where the DIMR slim is
    the middle tier, than that slim (`dimr.keep_ratio` of the layers); hub pairs are checked when they load."""
    models = raw["models"]
    depth = models["families"][models["family"]]["target"]["layers"]
    layers = (models.get("self_drafter") or {}).get("layers", SelfDrafterParams.layers)
    try:
        drafting = SelfDrafterParams(layers).keep_layers(depth)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    slim = round((raw.get("dimr") or {}).get("keep_ratio", 0.5) * depth)
    if method in ("viasd", "cascade_sd", "spec_cascade") and len(drafting) >= slim:
        raise ConfigError(f"{source}: study.runs.{i}: {run!r}: the self-drafter drafts with {len(drafting)} layers "
                          f"(models.self_drafter.layers) and the DIMR slim keeps {slim} (dimr.keep_ratio): the slim "
                          "is the middle tier, so it must keep more layers than the drafter")
