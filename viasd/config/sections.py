"""The typed sections of `params.yaml`: frozen dataclasses, one per section, and `parse`, which builds a
`Params` from a validated plain dict (`viasd.config.resolve`)."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ..data.near_duplicates import GroupingParams
from ..errors import ConfigError


@dataclass(frozen=True)
class ModelArch:
    layers: int
    hidden: int
    heads: int
    intermediate: int
    train_tokens: int
    lr: float
    kv_heads: int | None = None
    layer_drop: float = 0.0          # LayerDrop rate (of the last layer when the shape rises with depth)
    layer_drop_shape: str = "uniform"  # uniform | linear | exp: how the rate rises with depth (layer 0 is kept)
    early_exit: float = 0.0          # weight of the early-exit loss (the LM head on an intermediate layer)
    early_exit_layer: int | None = None  # exit after the target's layers 0..n-1 (None: a kept layer drawn per step)
    early_exit_loss: str = "labels"  # labels (LayerSkip) | full: the exit learns the full model's distribution
    self_distill: float = 0.0        # weight of the sub-network's KL to the full model (with layer_drop)
    distill: bool = False


@dataclass(frozen=True)
class FeatureDrafterArch:
    """A feature drafter of the family's target (`viasd train-drafter`): it reads the target's layers
    0..trunk_layers-1 (the slim's shared trunk), learns for `train_tokens` tokens at `lr`, and is trained to
    draft `ttt_steps` tokens ahead from its own outputs (training-time test), on `continuation_windows` windows of the
    target's own greedy continuations of corpus prefixes (0: on corpus windows)."""

    trunk_layers: int
    train_tokens: int
    lr: float
    ttt_steps: int = 3
    continuation_windows: int = 512  # the target's greedy continuations it trains on (0: corpus windows)


@dataclass(frozen=True)
class Family:
    name: str
    context: int
    target: ModelArch
    draft: ModelArch
    independent: ModelArch
    feature_drafter: FeatureDrafterArch | None = None

    def arch(self, role: str) -> ModelArch:
        return getattr(self, role)


@dataclass(frozen=True)
class BatchTableParams:
    """`batch_table:` — the study's speed against batch size (`viasd batch-table`): transformers' batched greedy
    `generate`, `ar`, `sd` at its best gamma on dev and the tuned `viasd`, each decoding the first `prompts` test
    prompts at most `size` at a time, for each of `sizes` (empty: off). Every prompt makes `max_new_tokens` tokens (no
    stop rule, so throughputs compare like with like; None: the task's own), timed over `repeats` rounds (the units
    of the ratios' intervals)."""

    sizes: tuple[int, ...] = ()
    prompts: int = 16
    max_new_tokens: int | None = 64
    repeats: int = 3


@dataclass(frozen=True)
class SelfDrafterParams:
    """`models.self_drafter` — the target's own first layers that draft for the runs with a `drafter_self`
    ablation (self-speculation: no model of its own, no training): `layers` of them (an integer), or that share
    of the target's decoder layers (a number in (0, 1), rounded, at least one), so that one setting serves pairs
    of any depth. Under VIA-SD the DIMR slim is the middle tier, so it must keep more layers than this."""

    layers: int | float = 2

    def keep_layers(self, depth: int) -> list[int]:
        """The drafting layers `0..n-1` of a target with `depth` decoder layers."""
        n = self.layers if isinstance(self.layers, int) else max(1, round(self.layers * depth))
        if n >= depth:
            raise ConfigError(f"models.self_drafter.layers: {self.layers} drafts with {n} of the target's {depth} "
                              "layers: a self-drafter must be shallower than the target")
        return list(range(n))


@dataclass(frozen=True)
class Pair:
    """A draft/target pair of the study: the trained family (`trained`) or two hub models / local dirs."""

    name: str
    target: str
    draft: str
    independent: str | None
    trained: bool
    dtype: str = "auto"
    trust_remote_code: bool = False


def _grouping(raw: dict) -> GroupingParams:
    """`data.near_duplicates` as typed parameters (defaults: `GroupingParams`)."""
    raw = dict(raw)
    raw["together"] = tuple(raw.get("together", ()))
    return GroupingParams(**raw)


@dataclass(frozen=True)
class DataParams:
    dir: Path
    split: dict
    vocab_size: int
    min_frequency: int
    calibration_sequences: int
    calibration_length: int
    max_files: int | None
    near_duplicates: GroupingParams = GroupingParams()


@dataclass(frozen=True)
class TrainParams:
    batch_size: int
    seq_len: int
    warmup_fraction: float = 0.05
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    checkpoint_every: int = 100
    distill_temperature: float = 1.0
    eval_tokens: int = 200_000
    precision: str = "float32"  # the forward passes: float32, bfloat16 autocast (mixed precision), or auto


DEFAULT_MAX_NEW_TOKENS = 128  # a task's max_new_tokens when params.yaml gives none


@dataclass(frozen=True)
class StudyParams:
    """`study:` — what the study runs: every pair x task x run."""

    name: str = "default"
    reports: str = "reports"
    optuna_storage: str | None = None  # null: SQLite files in models/optuna/; or a URL / journal file (*.log)
    optuna_heartbeat: int = 60  # seconds between a running trial's heartbeats when a search has workers
    pairs: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    runs: tuple[str, ...] = ()
    # drafters trained beside the family's models (`viasd train-drafter --drafter feature`): what the runs with a
    # drafter_<name> ablation draft with, a list so that DVC's stage can be a `foreach` over it (empty: none)
    drafters: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class DecodeParams:
    """`decode:` — the study's decoding policy outside the tuned thresholds, and the engine options."""

    split: str = "test"
    gamma: int = 4
    # sd and cascade_sd: "best" = the gamma at which the DIMR slim's threshold search found SD cheapest on dev
    # (the thresholds file's `sd_best`), or a fixed gamma
    sd_gamma: int | str = "best"
    gamma_slim: int | None = None
    cascade_rule: str = "opt"        # spec_cascade.rule
    cascade_alpha: float = 0.1       # spec_cascade.alpha
    max_lag: int = 0
    gate: float = 0.0
    draft_stop: float = 0.0          # dynamic draft length: stop drafting below this probability (0 = off)
    verify_lagged: bool = True
    reuse: bool = False
    cache: str = "inplace"           # decoding.policy.DEFAULT_CACHE (tests/test_config.py checks they agree)
    compile: bool = False
    generation_config: bool = True   # apply the target's generation config (decoding/processors.py)
    generation: dict = field(default_factory=dict)  # per-token generation settings over it

    def engine(self) -> dict:
        """The options of our methods that are not the method's own: the engine's (`cache`, `compile`,
        `reuse`) and the generation settings every model's distributions are processed with."""
        return {"cache": self.cache, "compile": self.compile, "reuse": self.reuse,
                "generation_config": self.generation_config, "generation": dict(self.generation)}

    def spec_cascade(self) -> dict:
        return {"rule": self.cascade_rule, "alpha": self.cascade_alpha}


@dataclass(frozen=True)
class DimrParams:
    """`dimr:` — the routing-mask search (`search.dimr.DimrConfig` takes `search_settings()`)."""

    keep_ratio: float = 0.5
    keep_prefix: int = 0
    encoder_keep_ratio: float | None = None
    cost: str = "path"
    n_random: int = 20
    n_bayes: int = 40
    sampler: str = "tpe"
    batch_size: int = 8
    baselines: tuple[str, ...] = ()
    workers: int = 1  # processes sharing the search's trials (search/workers.py); not a setting of the search

    def search_settings(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in ("baselines", "workers")}


@dataclass(frozen=True)
class ThresholdParams:
    """`thresholds:` — how the threshold search runs; `search` holds the search's own settings (the fields
    of `search.thresholds.ThresholdConfig`: trials, quality constraints, ranges), as given."""

    task: str = "stdlib_continuation"
    dev_prompts: int = 24
    confirm_prompts: int = 0
    per_slim: bool = True
    ablation_trials: int | None = None
    rules_trials: int | None = None
    workers: int = 1  # processes sharing each search's trials (search/workers.py)
    split_searches: bool = False  # each search its own workflow job (with one worker); not a setting of a search
    batch_size: int = 1  # dev prompts decoded together per pass (search/dev_set.py); 1 = one at a time
    wall_prompts: int = 8  # with batch_size > 1: the first prompts decoded alone, for the wall-time calibration
    seed: int | None = None  # the searches' sampler seed (None: the study's `seed`); the models do not depend on it
    search: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RouterParams:
    """`router:` — the learned router's rows (oracle decodes of calibration windows) and fit."""

    gamma: int | None = None         # None: the largest of thresholds.gamma
    prompts: int = 64
    prompt_tokens: int = 128
    max_new_tokens: int = 128
    probe: bool | str = "auto"      # True | False | "auto": chosen on validation decodes
    l2: float | tuple[float, ...] = (1e-5, 1e-4, 1e-3, 1e-2)  # several: chosen per head on validation decodes
    holdout: float = 0.25


@dataclass(frozen=True)
class Params:
    seed: int
    data: DataParams
    tasks: dict  # task name -> dict of its parameters
    models_dir: Path
    family: Family
    train: TrainParams
    study: StudyParams = field(default_factory=StudyParams)
    decode: DecodeParams = field(default_factory=DecodeParams)
    dimr: DimrParams = field(default_factory=DimrParams)
    thresholds: ThresholdParams = field(default_factory=ThresholdParams)
    router: RouterParams = field(default_factory=RouterParams)
    self_drafter: SelfDrafterParams = field(default_factory=SelfDrafterParams)
    batch_table: BatchTableParams = field(default_factory=BatchTableParams)
    raw: dict = field(repr=False, default_factory=dict)

    def search_heartbeat(self, workers: int) -> int | None:
        """The heartbeat interval of a search's running trials: `study.optuna_heartbeat` seconds when the
        search is shared by several workers (a dead worker's trial is then failed and retried), else None."""
        return self.study.optuna_heartbeat if workers > 1 else None

    def section(self, name: str) -> dict:
        """A section of params.yaml as written (what the tracking boundary logs)."""
        return copy.deepcopy(self.raw.get(name) or {})

    def max_new_tokens(self, task: str) -> int:
        """The task's `max_new_tokens` (the study's decodes and searches on it)."""
        return int(self.tasks.get(task, {}).get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS))

    def model_dir(self, role: str) -> Path:
        return self.models_dir / self.family.name / role

    @property
    def reports_dir(self) -> Path:
        """`study.reports` (default `reports/`) beside params.yaml: decode and evaluation outputs, tables, plots."""
        return self.models_dir.parent / self.study.reports

    @property
    def device(self) -> str:
        return self.raw["models"].get("device", "auto")

    def pair(self, name: str | None = None) -> Pair:
        """The named pair (default: the study's first). Hub pairs keep their ids; the trained family's
        models live in `models/<family>/<role>`."""
        name = name or self.study.pairs[0]
        if name == self.family.name:
            return Pair(name, str(self.model_dir("target")), str(self.model_dir("draft")),
                        str(self.model_dir("independent")), trained=True)
        hub = self.raw["models"].get("hub_pairs") or {}
        if name not in hub:
            known = ", ".join([self.family.name, *hub])
            raise ConfigError(f"unknown pair {name!r}; the pairs are models.family and models.hub_pairs: {known}")
        spec = hub[name]
        return Pair(name, spec["target"], spec["draft"], spec.get("independent"), trained=False,
                    dtype=spec.get("dtype", "auto"), trust_remote_code=spec.get("trust_remote_code", False))


def parse(raw: dict, root: Path = Path(".")) -> Params:
    data = raw["data"]
    models = raw["models"]
    fam_raw = models["families"][models["family"]]
    family = Family(models["family"], fam_raw["context"],
                    *(ModelArch(**fam_raw[role]) for role in ("target", "draft", "independent")),
                    FeatureDrafterArch(**fam_raw["feature_drafter"]) if fam_raw.get("feature_drafter") else None)
    return Params(
        seed=raw["seed"],
        data=DataParams(root / data["dir"], dict(data["split"]), data["tokenizer"]["vocab_size"],
                        data["tokenizer"].get("min_frequency", 2), data["calibration"]["sequences"],
                        data["calibration"]["length"], data.get("max_files"),
                        _grouping(data.get("near_duplicates", {}))),
        tasks=copy.deepcopy(raw["tasks"]),
        models_dir=root / models["dir"],
        family=family,
        train=TrainParams(**raw["train"]),
        study=_section(StudyParams, raw.get("study")),
        decode=_decode_params(raw.get("decode") or {}),
        dimr=_section(DimrParams, raw.get("dimr")),
        thresholds=_threshold_params(raw.get("thresholds") or {}),
        router=_section(RouterParams, raw.get("router")),
        self_drafter=_section(SelfDrafterParams, models.get("self_drafter")),
        batch_table=_section(BatchTableParams, raw.get("batch_table")),
        raw=raw,
    )


def _section(kind, values: dict | None):
    """A typed section: lists as tuples, the dataclass's defaults for what is not given."""
    return kind(**{k: tuple(v) if isinstance(v, list) else v for k, v in (values or {}).items()})


def _decode_params(section: dict) -> DecodeParams:
    cascade = section.get("spec_cascade") or {}
    rest = {k: v for k, v in section.items() if k != "spec_cascade"}
    return _section(DecodeParams, {**rest, **{f"cascade_{k}": v for k, v in cascade.items()}})


def _threshold_params(section: dict) -> ThresholdParams:
    stage = {f.name for f in fields(ThresholdParams)} - {"search"}
    return ThresholdParams(**{k: v for k, v in section.items() if k in stage},
                           search={k: v for k, v in section.items() if k not in stage})
