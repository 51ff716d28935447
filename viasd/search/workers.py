"""One Optuna study's trials, run by one process or shared by many workers on one storage.

A search (`dimr_search`, `tune_thresholds`) runs its trials through `run_trials`, which drives Optuna's own loop
(`Study.optimize`) with Optuna's own machinery:
- the budget is `optuna.study.MaxTrialsCallback`, counted in the storage: the study stops once `n_trials` trials are
  COMPLETE (a serial search) or COMPLETE + RUNNING (a worker sharing the study: the RUNNING ones are other workers'
  and complete there);
- on a storage with heartbeats (an RDB storage, `search.storage`), `optimize` records each running trial's heartbeat
  and, before each trial, fails the trials whose heartbeat went silent (a killed worker's); the storage's
  `RetryHeartbeatStaleTrialCallback` enqueues each such point again, and the next trial runs it;
- each trial's sampler is set by a callback: reseeded by the trials completed (a killed search resumes where it
  stopped, its sampler where it was), offset per worker (`Worker.seed`), so two workers do not propose the same point.

What Optuna does not do, kept here and small:
- two workers that each see one trial of budget left ask at the same moment: `MaxTrialsCallback` runs after a trial,
  so it cannot stop the second. The storage numbers trials atomically, so the trial whose lower-numbered COMPLETE and
  RUNNING trials already fill the budget is the surplus: it is pruned unrun (user attr `surplus`), and exactly
  `n_trials` complete;
- a worker whose budget is full of other workers' RUNNING trials waits (`poll_s`) for them to complete, or to go
  stale and come back enqueued, which `optimize` alone would not (it stops). Without heartbeats (a journal file) it
  stops instead, and the serial pick job completes whatever a lost worker left;
- a serial run shares the study with no running process, so a trial it finds RUNNING was left by one that was
  killed: it is marked FAIL first (a resumed study shows no trial running forever, and a sampler does not treat its
  point as pending);
- a trial failed as stale while its worker was only paused (longer than the grace period) cannot be told its value:
  Optuna raises, and the worker logs it and goes on (the point runs again from the queue).

A search can also be run whole by a process of its own that writes nothing (`Worker(part=True)`, the
`thresholds.split_searches` jobs): it runs the search's trials exactly as the serial search would (the
serial seeds), leaving the choice and the outputs to the stage's final serial run, which finds the study
complete. The searches of a stage then spread over processes without changing a trial.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

# a worker's sampler seed is offset by this per worker index (a search never runs this many trials)
WORKER_SEED_STRIDE = 100_003


@dataclass(frozen=True)
class Worker:
    """Which of `count` processes sharing one study this is (0-based). `part`: a process that runs whole
    searches alone, as the serial search would, and writes nothing (the stage's final run picks)."""

    index: int = 0
    count: int = 1
    part: bool = False

    def __post_init__(self):
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(f"worker {self.index} of {self.count}: the index must be in 0..{self.count - 1}")
        if self.part and self.count > 1:
            raise ValueError("a part runs its searches alone: it is not one of several workers")

    @property
    def shared(self) -> bool:
        """Other processes may be running trials of the same study now."""
        return self.count > 1

    @property
    def partial(self) -> bool:
        """This process runs trials only: it neither makes the choice nor writes the search's outputs."""
        return self.shared or self.part

    @property
    def lead(self) -> bool:
        """The worker that seeds a new study (its enqueued warm starts): worker 0."""
        return self.index == 0

    def seed(self, base: int, completed: int) -> int:
        """The sampler seed before the next trial: reseeded by the trials completed (so a resumed search
        does not propose its earlier points again), offset per worker."""
        return base + completed + self.index * WORKER_SEED_STRIDE

    def __str__(self) -> str:
        return "part" if self.part else f"worker {self.index + 1}/{self.count}"


SERIAL = Worker()  # the one process of a search that no other process shares
PART = Worker(part=True)  # a process running whole searches of a stage alone, writing nothing


def heartbeat_interval(storage) -> int | None:
    """The storage's heartbeat interval in seconds (None: the storage records no heartbeats)."""
    get_interval = getattr(storage, "get_heartbeat_interval", None)  # storages with heartbeats (RDB, journal)
    return get_interval() if callable(get_interval) else None


def run_trials(study, storage, n_trials: int, sampler_for: Callable[[int], object], evaluate: Callable,
               worker: Worker = SERIAL, on_trial: Callable | None = None, poll_s: float | None = None) -> list:
    """Run trials of `study` until it holds `n_trials` COMPLETE ones (or, for a shared worker, until the
    rest are running elsewhere); returns the study's COMPLETE trials (FrozenTrial, by number).

    `sampler_for(completed)`: the sampler of the next trial, given how many have completed (seed it
    with `worker.seed`); `evaluate(trial)`: runs the trial and returns its objective value (it may set
    user attributes and constraints); `on_trial(frozen)`: after each trial this worker completes (a
    progress bar); `storage`: the study's storage object (or URL), to know whether it keeps heartbeats; `poll_s`:
    how long a shared worker waits between looks at other workers' running trials (default: the heartbeat
    interval).
    """
    import optuna
    from optuna.study import MaxTrialsCallback

    TrialState = optuna.trial.TrialState
    interval = heartbeat_interval(storage)
    poll_s = poll_s or interval or 5
    if not worker.shared:  # no other process runs this study's trials: a RUNNING one is a stopped process's
        for stopped in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            log.warning("trial %d was left running by a process that stopped: marked failed", stopped.number)
            study.tell(stopped.number, state=TrialState.FAIL)

    def complete() -> int:
        return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))

    def objective(trial) -> float:
        if worker.shared and _surplus(study, trial.number, n_trials):
            trial.set_user_attr("surplus", True)
            raise optuna.TrialPruned("beyond the trial budget: other workers asked for its place first")
        return evaluate(trial)

    def after(study_, frozen) -> None:
        study_.sampler = sampler_for(complete())
        if frozen.state == TrialState.COMPLETE and on_trial is not None:
            on_trial(frozen)

    budget = MaxTrialsCallback(n_trials, states=(TrialState.COMPLETE, TrialState.RUNNING) if worker.shared
                               else (TrialState.COMPLETE,))
    while True:
        if interval:
            optuna.storages.fail_stale_trials(study)
        trials = study.get_trials(deepcopy=False)
        done = sum(t.state == TrialState.COMPLETE for t in trials)
        if done >= n_trials:
            break
        waiting = any(t.state == TrialState.WAITING for t in trials)
        running = sum(t.state == TrialState.RUNNING for t in trials) if worker.shared else 0
        if done + running >= n_trials and not waiting:
            if not interval:
                log.info("%s: the remaining %d trial(s) run elsewhere; stopping", worker, n_trials - done)
                break
            time.sleep(poll_s)  # wait for them to complete, or to go stale and be enqueued again
            continue
        study.sampler = sampler_for(done)
        try:
            study.optimize(objective, callbacks=[budget, after])
        except ValueError as err:  # told after its trial was failed as stale (a long pause): its point runs again
            if "Cannot tell a FAIL trial" not in str(err):
                raise
            log.warning("%s: a trial was failed as stale by another worker; its point runs again", worker)
    finished = sorted((t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE),
                      key=lambda t: t.number)
    return finished[:n_trials] if worker.shared else finished


def _surplus(study, number: int, n_trials: int) -> bool:
    """Whether trial `number` is beyond the budget: `n_trials` trials of lower number are already
    COMPLETE or RUNNING (asked by other workers in the same moment)."""
    import optuna

    live = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING)
    ahead = sum(t.number < number and t.state in live for t in study.get_trials(deepcopy=False))
    return ahead >= n_trials


def completed_points(storage, study_name: str, attr: str) -> tuple[object, list[dict]]:
    """A stored study's user attribute `attr` and its COMPLETE trials as points (their user attributes,
    with `number`)."""
    import optuna

    study = optuna.load_study(study_name=study_name, storage=storage)
    return study.user_attrs.get(attr), [{"number": t.number, **t.user_attrs} for t in
                                        study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))]
