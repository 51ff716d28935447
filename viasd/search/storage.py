"""Where the searches' Optuna studies live, and what they are called: one storage for every search of a
study, shared by the workers of a cluster when `study.optuna_storage` names one."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path


def optuna_storage(shared: str | None, default_file: Path, root: Path, heartbeat_s: int | None = None):
    """`shared` (`study.optuna_storage`) when set — an RDB URL (postgresql://, mysql://, sqlite://) or a
    journal file (`*.log`, safe on shared file systems; relative to `root`) that several workers can
    share — else the SQLite file `default_file`.

    `heartbeat_s` (a search fanned out over workers, `search.workers`): an RDB storage then records each
    running trial's heartbeat every `heartbeat_s` seconds, fails a trial silent for `3 x heartbeat_s`
    (its worker died) and enqueues its point again. A journal file keeps no heartbeats: there a dead
    worker's trial is replaced by the search's final (serial) job instead."""
    if shared and shared.endswith(".log"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        path = Path(shared) if Path(shared).is_absolute() else root / shared
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    if not shared:
        default_file.parent.mkdir(parents=True, exist_ok=True)
        shared = f"sqlite:///{default_file}"
    if not heartbeat_s:
        return shared
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
    from sqlalchemy.exc import SQLAlchemyError

    # several processes write one SQLite file: wait for its lock rather than fail at once
    engine = {"connect_args": {"timeout": 120}} if shared.startswith("sqlite") else None
    for attempt in range(5):
        try:
            return RDBStorage(shared, engine_kwargs=engine, heartbeat_interval=heartbeat_s,
                              grace_period=3 * heartbeat_s,
                              heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=3))
        except SQLAlchemyError:  # workers starting together race to create the schema: the loser retries
            if attempt == 4:
                raise
            time.sleep(0.5 * (attempt + 1))


def study_name(prefix: str, config: dict) -> str:
    """One Optuna study per parameter set: a changed parameter starts afresh, the same one resumes."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    return f"{prefix}-{digest}"
