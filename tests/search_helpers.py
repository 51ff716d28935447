"""Real kill-and-resume of a search: run `viasd` in a subprocess, SIGKILL it once its Optuna storage holds
some finished trials, and read the storage's trials."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import optuna


def complete_trials(storage, prefix):
    """Finished trials of the one study named `<prefix>-<parameter hash>` in the storage."""
    try:
        names = [n for n in optuna.get_all_study_names(storage) if n.startswith(prefix + "-")]
    except Exception:  # no storage yet
        return []
    assert len(names) <= 1, names
    if not names:
        return []
    study = optuna.load_study(study_name=names[0], storage=storage)
    return [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]


def count_complete_readonly(path) -> int:
    """Finished trials, read without touching the schema the running search may be creating."""
    import sqlite3

    if not path.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1) as db:
            return db.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
    except sqlite3.OperationalError:  # tables not created yet, or locked for a moment
        return 0


def kill_after_trials(args, storage_path, trials: int) -> None:
    """Run `viasd ARGS` in a subprocess and SIGKILL it once `trials` trials are stored."""
    proc = subprocess.Popen([sys.executable, "-m", "viasd.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 240
    while proc.poll() is None and time.time() < deadline:
        if count_complete_readonly(storage_path) >= trials:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the search finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
