"""Where the searches' Optuna studies live, and what they are called: one storage for every search of a
study, shared by the workers of a cluster when `study.optuna_storage` names one."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def optuna_storage(shared: str | None, default_file: Path, root: Path):
    """`shared` (`study.optuna_storage`) when set — an RDB URL (postgresql://, mysql://) or a journal file
    (`*.log`, safe on shared file systems; relative to `root`) that several workers can share — else the
    SQLite file `default_file`."""
    if not shared:
        default_file.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{default_file}"
    if shared.endswith(".log"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        path = Path(shared) if Path(shared).is_absolute() else root / shared
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    return shared


def study_name(prefix: str, config: dict) -> str:
    """One Optuna study per parameter set: a changed parameter starts afresh, the same one resumes."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    return f"{prefix}-{digest}"
