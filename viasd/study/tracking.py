"""MLflow tracking at the stage boundary (never imported by decoding, routing or the searches).

Results are files first and MLflow second: a tracking failure is logged as a warning and never
loses or fails a stage. The store is `MLFLOW_TRACKING_URI` if set, else `sqlite:///mlflow.db` beside
params.yaml; one experiment per study (`viasd-<family>`). Transient errors (a locked SQLite
database under parallel jobs) are retried.

Runs carry MLflow's standard source tags (`mlflow.source.git.commit`, `mlflow.source.name`,
`mlflow.source.type`) and `git_dirty` (uncommitted changes to tracked files). A workflow invocation
opens a parent run (`open_run` with tag stage=study, from Snakemake's `onstart`) and exports its id as
`VIASD_PARENT_RUN_ID`; every stage run of that invocation is nested under it (`mlflow.parentRunId`),
and the parent ends FINISHED or FAILED with the workflow.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable
from functools import partial
from pathlib import Path

log = logging.getLogger(__name__)


def study_root(root: Path) -> Path:
    """Where the study's own tracking files live (the default store `mlflow.db`, `.viasd/pending-runs`):
    `root`, the folder of params.yaml, except under a DVC experiment run in a temporary workspace
    (`dvc exp run --queue` / `--temp`), whose stages DVC gives the project's root as `DVC_ROOT`: their
    runs go to the same store as `dvc repro`'s, not to a folder DVC deletes."""
    dvc_root = os.environ.get("DVC_ROOT")
    return Path(dvc_root) if dvc_root and os.environ.get("DVC_STAGE") else Path(root)


def tracking_uri(root: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{study_root(root).resolve() / 'mlflow.db'}"


PARENT_ENV = "VIASD_PARENT_RUN_ID"


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit(root: Path) -> str | None:
    return _git(root, "rev-parse", "HEAD") or None


def git_dirty(root: Path) -> bool | None:
    """Whether tracked files differ from the commit (None outside a git work tree)."""
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status)


def source_tags(root: Path, name: str) -> dict:
    """MLflow's standard source tags plus `git_dirty`."""
    commit = git_commit(root)
    tags = {"mlflow.source.name": name, "mlflow.source.type": "LOCAL", "git_commit": commit or "unknown"}
    if commit:
        tags["mlflow.source.git.commit"] = commit
        dirty = git_dirty(root)
        if dirty is not None:
            tags["git_dirty"] = str(dirty).lower()
    return tags


def dvc_md5(path: Path) -> str | None:
    """The hash DVC records for `path` in dvc.lock (a file's md5; a directory's `<md5>.dir`), computed by
    DVC's own hashing library (`dvc_data`) without adding anything to a cache; None if `path` is absent."""
    import tempfile

    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db import HashFileDB
    from dvc_objects.fs.local import LocalFileSystem

    path = Path(path)
    if not path.exists():
        return None
    fs = LocalFileSystem()
    with tempfile.TemporaryDirectory() as staging:
        _, _, obj = build(HashFileDB(fs, staging), str(path.resolve()), fs, "md5", dry_run=True)
    return obj.hash_info.value


def input_hashes(inputs: dict[str, Path]) -> dict[str, str]:
    """`dvc_md5.<name>` tags for a stage's inputs (those that exist)."""
    tags = {}
    for name, path in inputs.items():
        value = dvc_md5(path)
        if value is not None:
            tags[f"dvc_md5.{name}"] = value
    return tags


def init_store(root: Path, experiment: str) -> str:
    """Create the store's schema and the study's experiment once, before parallel jobs log to it."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri(root))
    found = client.get_experiment_by_name(experiment)
    exp_id = found.experiment_id if found else _create_experiment(client, experiment)
    return f"{tracking_uri(root)} experiment {experiment} ({exp_id}); in `mlflow ui`: {ui_page(exp_id)}"


def ui_page(experiment_id: str, server: str = "http://127.0.0.1:5000") -> str:
    """The MLflow UI's page of the study's runs. MLflow 3.17's UI opens on its GenAI views unless the
    page asks for the model-training workflow (or the user picks "Model training" at the top)."""
    return f"{server}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def experiment_client(root: Path, experiment: str):
    """An `MlflowClient` on the study's store and the experiment's id (created if missing)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri(root))
    return client, _experiment_id(client, experiment)


def describe_experiment(root: Path, experiment: str, markdown) -> None:
    """Set the experiment's description (`mlflow.note.content`), which the MLflow UI shows at the top of the
    experiment's page in every view; `markdown`: the text, or a function of the experiment's id that makes it."""
    client, exp_id = experiment_client(root, experiment)
    client.set_experiment_tag(exp_id, "mlflow.note.content", markdown(exp_id) if callable(markdown) else markdown)


def artifact_url(run_id: str, path: str) -> str:
    """An artifact's URL on the MLflow server that shows it (relative: the UI's own host)."""
    return f"get-artifact?path={path}&run_uuid={run_id}"


def _flatten(data: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def retrying(fn, what: str, attempts: int = 5):
    """`fn()`, retried on a locked SQLite store; None (and a warning) when tracking fails."""
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as err:  # noqa: BLE001 - tracking must never fail a stage
            transient = "locked" in str(err).lower() or "busy" in str(err).lower()
            if transient and attempt + 1 < attempts:
                time.sleep(0.5 * (attempt + 1))
                continue
            log.warning("MLflow tracking failed to %s (%s); the stage's results are in its output files", what, err)
            return None
    return None


def record_run(root: Path, experiment: str, run_name: str, params: dict, metrics: dict, tags: dict,
               artifacts: Iterable[Path] = (), series: dict[str, list[float]] | None = None,
               attempts: int = 5, run_id: str | None = None, datasets: dict | None = None) -> str | None:
    """Log one MLflow run (into `run_id`, opened by `open_run` when the stage started, else one opened
    here) and end it FINISHED; returns its id, or None when tracking failed (the stage still succeeds).
    The run is created once: a retry after a locked store logs into the same run. `datasets`: the task splits
    the stage read (`StageRecord.datasets`), logged as the run's dataset inputs (`log_datasets`)."""
    if run_id is None:
        run_id = open_run(root, experiment, run_name, tags)
        if run_id is None:
            return None
    if datasets:
        retrying(lambda: log_datasets(root, run_id, datasets), "log the run's datasets", attempts)
    if retrying(lambda: record_into(root, run_id, run_name, params, metrics, tags, artifacts, series or {}),
                 "record the run", attempts):
        return run_id
    close_run(root, run_id, "FAILED", "tracking failed; the stage's results are in its output files")
    return None


def run_tags(root: Path, run_name: str, tags: dict, nested: bool = True) -> dict:
    all_tags = {"mlflow.runName": run_name, **source_tags(root, f"viasd {run_name.split('/')[0]}"), **tags}
    parent = os.environ.get(PARENT_ENV)
    if parent and nested:
        all_tags["mlflow.parentRunId"] = parent
    return {k: str(v) for k, v in all_tags.items()}


def dvc_invocation() -> str | None:
    """Under `dvc repro` / `dvc exp run` (DVC sets `DVC_STAGE` for every stage command): an id of the DVC
    process running the stages, its pid and start time from /proc, so that the stages of one invocation
    find one parent run (`dvc_parent_run`); None outside DVC or where /proc cannot tell (no parent)."""
    if "DVC_STAGE" not in os.environ:
        return None
    pid = os.getppid()
    for _ in range(4):  # the stage command, the shell DVC started it with, DVC itself
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        if any(Path(a.decode(errors="replace")).name == "dvc" for a in argv[:2]):
            return f"{pid}:{fields[19]}"  # stat field 22, the start time: pids are reused, this pair is not
        pid = int(fields[1])
    return None


def dvc_parent_run(root: Path, experiment: str, invocation: str) -> str | None:
    """The parent run of the DVC invocation `invocation` (opened by its first stage, RUNNING again while a
    later stage runs; each stage leaves it FINISHED or FAILED with itself, so it ends as the invocation
    does)."""
    from mlflow.tracking import MlflowClient

    def find():
        client = MlflowClient(tracking_uri(root))
        found = client.search_runs([_experiment_id(client, experiment)],
                                   f"tags.`viasd.dvc_invocation` = '{invocation}'", max_results=1)
        if not found:
            return None
        client.update_run(found[0].info.run_id, "RUNNING")
        return found[0].info.run_id

    run_id = retrying(find, "find the DVC invocation's parent run")
    if run_id is None:
        run_id = open_run(root, experiment, "study/dvc", {"stage": "study", "viasd.dvc_invocation": invocation},
                          nested=False)
    return run_id


def _experiment_id(client, experiment: str) -> str:
    found = client.get_experiment_by_name(experiment)
    return found.experiment_id if found else _create_experiment(client, experiment)


def open_run(root: Path, experiment: str, run_name: str, tags: dict | None = None, nested: bool = True) -> str | None:
    """Open a stage's run when the stage starts (RUNNING, nested under the invocation's parent unless
    `nested` is false): live metrics go to it, a crash ends it FAILED with the error, `record_run`
    completes it."""
    from mlflow.tracking import MlflowClient

    def create():
        client = MlflowClient(tracking_uri(root))
        exp_id = _experiment_id(client, experiment)
        run_id = client.create_run(exp_id, run_name=run_name,
                                   tags=run_tags(root, run_name, {**owner_tags(), **(tags or {})}, nested)).info.run_id
        if nested:  # a stage's run (parents are opened by short-lived commands: their owner is never alive)
            end_abandoned(client, exp_id, run_name, run_id)
        return run_id

    return retrying(create, "open the run")


def end_abandoned(client, exp_id: str, run_name: str, successor: str) -> int:
    """End KILLED the runs named `run_name` still RUNNING whose job is gone (`_abandoned`): a job of the
    same stage and cell killed with SIGKILL, a SLURM job cancelled or out of time. The job running again
    now (`successor`) replaces it, so no run is left RUNNING by a job that no longer runs; the ended run
    keeps a `viasd.superseded_by` tag. A run whose job may still be running (another machine, no SLURM
    job to ask about) is left alone. Returns how many were ended."""
    quoted = run_name.replace("'", "\\'")
    stale = client.search_runs([exp_id], f"attributes.run_name = '{quoted}' and attributes.status = 'RUNNING'",
                               max_results=100)
    ended = 0
    for run in stale:
        if run.info.run_id != successor and _abandoned(run.data.tags):
            client.set_tag(run.info.run_id, "viasd.superseded_by", successor)
            client.set_terminated(run.info.run_id, "KILLED")
            ended += 1
    return ended


def owner_tags() -> dict:
    """Who opened a run: the host, the process (pid and its start time: pids are reused) and the SLURM
    job, for `_abandoned` to tell later whether that job still runs."""
    tags = {"viasd.host": socket.gethostname(), "viasd.pid": str(os.getpid()), "viasd.pid_start": _start_time(os.getpid())}
    if os.environ.get("SLURM_JOB_ID"):
        tags["viasd.slurm_job"] = os.environ["SLURM_JOB_ID"]
    return tags


def _start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _abandoned(tags: dict) -> bool:
    """Whether the job that opened a run (its `owner_tags`) has ended: its SLURM job is no longer known to
    `squeue`, or its process on this host is gone."""
    job = tags.get("viasd.slurm_job")
    if job and shutil.which("squeue"):
        proc = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True)
        if proc.returncode == 0:
            return not proc.stdout.strip()
        return "invalid job id" in proc.stderr.lower()  # finished long ago; any other failure: unknown
    if tags.get("viasd.host") == socket.gethostname() and tags.get("viasd.pid"):
        pid = int(tags["viasd.pid"])
        return not Path(f"/proc/{pid}").exists() or _start_time(pid) != tags.get("viasd.pid_start", "")
    return False


def close_run(root: Path, run_id: str, status: str, error: str | None = None) -> None:
    """End an open run (FAILED with the error's text, or FINISHED)."""
    from mlflow.tracking import MlflowClient

    def close():
        client = MlflowClient(tracking_uri(root))
        if error:
            client.set_tag(run_id, "error", error[:5000])
        client.set_terminated(run_id, status)

    retrying(close, "close the run")


def discard_run(root: Path, run_id: str) -> None:
    """Delete an open run that recorded nothing (a stage that found its outputs up to date)."""
    from mlflow.tracking import MlflowClient

    retrying(lambda: MlflowClient(tracking_uri(root)).delete_run(run_id), "discard the run")


def log_live(root: Path, run_id: str, key: str, value: float, step: int) -> None:
    """One live metric point (e.g. the training loss while training runs); failures only warn."""
    from mlflow.tracking import MlflowClient

    retrying(lambda: MlflowClient(tracking_uri(root)).log_metric(run_id, key, float(value), step=step),
              "log a metric", attempts=2)


def log_datasets(root: Path, run_id: str, datasets: dict) -> bool:
    """Each `{name: (file, context)}` as a dataset input of the run: MLflow's record of what the run read (the
    file's path as its source, its DVC md5 as its digest, so the UI's dataset names the same version `dvc.lock`
    does), shown in the run's "Datasets used" and filterable in the runs table."""
    import mlflow
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    present = {name: (Path(path), context) for name, (path, context) in datasets.items() if Path(path).exists()}
    if not present:
        return True
    mlflow.set_tracking_uri(tracking_uri(root))
    with mlflow.start_run(run_id=run_id):  # resumed for its inputs; `record_into` ends it
        for name, (path, context) in present.items():
            source = resolve_dataset_source(str(path.resolve()))
            mlflow.log_input(MetaDataset(source, name=name, digest=(dvc_md5(path) or "")[:8] or None), context=context)
    return True


def record_into(root, run_id, run_name, params, metrics, tags, artifacts, series) -> bool:
    """Name the open run `run_id` after the stage, log its parameters, metrics and artifacts, end it."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri(root))
    now = int(time.time() * 1000)
    flat = {k: v for k, v in _flatten(params).items() if v is not None}
    batch_params = [Param(k, str(v)[:6000]) for k, v in sorted(flat.items())]
    batch_metrics = [Metric(k, float(v), now, 0) for k, v in _flatten(metrics).items() if _numeric(v)]
    for name, values in series.items():
        batch_metrics += [Metric(name, float(v), now, i) for i, v in enumerate(values) if _numeric(v)]
    named = {"mlflow.runName": run_name, **tags}
    client.log_batch(run_id, params=batch_params, metrics=batch_metrics,  # MLflow splits it into allowed sizes
                     tags=[RunTag(k, str(v)) for k, v in named.items()])
    for path in artifacts:
        if Path(path).exists():
            client.log_artifact(run_id, str(path))
    client.set_terminated(run_id, "FINISHED")
    return True


def record_children(root: Path, experiment: str, parent_id: str, children: list[dict]) -> None:
    """One nested run per child (`{"name", "params", "metrics"}`, e.g. each Optuna trial of a search)
    under `parent_id`, FINISHED; failures only warn."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri(root))
    exp_id = retrying(lambda: _experiment_id(client, experiment), "find the experiment")
    if exp_id is None:
        return
    now = int(time.time() * 1000)

    def create(name):
        tags = {"mlflow.runName": name, "mlflow.parentRunId": parent_id, "stage": "trial"}
        return client.create_run(exp_id, run_name=name, tags=tags).info.run_id

    def log(run_id, params, metrics):
        client.log_batch(run_id, metrics=metrics, params=params)
        client.set_terminated(run_id, "FINISHED")
        return True

    for child in children:  # each child created once; a retry after a locked store logs into the same run
        run_id = retrying(partial(create, child["name"]), "record a trial")
        if run_id is None:
            return
        params = [Param(k, str(v)[:6000]) for k, v in sorted(_flatten(child.get("params", {})).items()) if v is not None]
        metrics = [Metric(k, float(v), now, 0) for k, v in _flatten(child.get("metrics", {})).items() if _numeric(v)]
        retrying(partial(log, run_id, params, metrics), "record a trial")


# the experiment's kind: MLflow UIs that read it (3.x before the GenAI / Model training switch) open it on its runs;
# 3.17's UI takes the mode from the browser instead (study.mlflow_view)
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}


def _create_experiment(client, name: str) -> str:
    """The study's experiment; on a local SQLite store its artifacts go beside the store (`mlruns/` next to
    mlflow.db), not into whatever folder the first command happened to run from."""
    uri = client.tracking_uri
    location = None
    if uri.startswith("sqlite:///"):
        location = (Path(uri[len("sqlite:///"):]).parent / "mlruns").resolve().as_uri()
    try:
        return client.create_experiment(name, artifact_location=location, tags=EXPERIMENT_TAGS)
    except Exception:  # created meanwhile by a parallel job
        return client.get_experiment_by_name(name).experiment_id
