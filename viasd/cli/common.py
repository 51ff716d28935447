"""What every study subcommand shares: --params/--config, the pair and grid cell, MLflow at the boundary."""

from __future__ import annotations

from pathlib import Path

from ..errors import ViasdError


def add_params(p) -> None:
    p.add_argument("--params", type=Path, default=Path("params.yaml"), help="the study's parameter file")
    p.add_argument("--config", type=Path, action="append", default=[], metavar="FILE",
                   help="a file merged over --params (e.g. config/smoke.yaml); may be repeated")
    p.add_argument("--no-track", action="store_true", help="do not record the run in MLflow")



def experiment(params) -> str:
    return f"viasd-{params.study['name']}"



def track(args, params, stage: str, run_name: str, run_params: dict, metrics: dict, tags: dict | None = None,
           artifacts=(), series=None, inputs: dict | None = None) -> None:
    """Record the stage run in MLflow (after its files are written; a failure only warns)."""
    if args.no_track or metrics.get("up_to_date"):
        return
    from ..tracking import input_hashes, record_run

    tags = {"stage": stage, "pair": params.pair(getattr(args, "pair", None)).name, **(tags or {})}
    tags.update(input_hashes(inputs or {}))
    record_run(args.params.resolve().parent, experiment(params), run_name, run_params, metrics, tags, artifacts,
               series)



def stage_parser(sub, name: str, help: str, func):
    """A subcommand of the study: reads params.yaml (+ --config overrides), records itself in MLflow."""
    p = sub.add_parser(name, help=help)
    add_params(p)
    p.set_defaults(func=func)
    return p



def load_params(args):
    from .. import config

    return config.load(args.params, args.config)



def add_pair(p) -> None:
    p.add_argument("--pair", help="a pair of study.pairs (default: the first)")


def add_grid_cell(p) -> None:
    """--pair, --task, --run: one cell of the study grid (see `grid_cell`)."""
    add_pair(p)
    p.add_argument("--task", required=True)
    p.add_argument("--run", required=True, help="a method, or method-ablation, e.g. viasd-mask_random")



def scalars(data: dict) -> dict:
    return {k: v for k, v in data.items() if not isinstance(v, (dict, list, str))}



def grid_cell(args):
    """Parameters, pair and run of a `--pair/--task/--run` command."""
    from ..stages.runs import parse_run

    params = load_params(args)
    try:
        spec = parse_run(args.run)
    except ValueError as err:
        raise ViasdError(f"--run {err}") from None
    return params, params.pair(args.pair), spec



def cell_tags(pair, task: str, spec) -> dict:
    return {"pair": pair.name, "task": task, "method": spec.method, "ablation": spec.ablation or "none",
            "run": spec.name}



def input_files(params, pair, task: str | None = None, run: str | None = None) -> dict:
    """A stage's inputs, for the `dvc_md5.*` tags of its MLflow run."""
    from ..stages.decode_stage import run_inputs

    files = {"data.manifest": params.data.dir / "manifest.json"}
    if pair.trained:
        files.update({f"model.{r}": params.model_dir(r) for r in ("target", "draft")})
    if run is not None:
        files.update(run_inputs(params, pair.name, task, run))
        if "thresholds" in files:  # DVC tracks (and hashes) the pair x task's thresholds as one directory
            files["thresholds"] = files["thresholds"].parent
    return files
