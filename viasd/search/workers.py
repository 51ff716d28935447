"""One Optuna study's trials, run by one process or shared by many workers on one storage.

A search (`dimr_search`, `tune_thresholds`) asks, evaluates and tells its trials through `run_trials`.
With one worker (`Worker()`, the default and the pick job of a fanned-out search) it runs exactly what
the study still lacks: `n_trials` COMPLETE trials, the sampler reseeded by the number completed, so a
killed search resumes where it stopped and a finished one does nothing.

With several workers on one storage (`Worker(index, count)`, `thresholds.workers` / `dimr.workers`) the
budget is counted in the storage, not per process:
- a worker starts a trial only while COMPLETE + RUNNING trials number fewer than `n_trials`, and a trial
  it asked for that turns out to be beyond the budget (two workers asked at the same moment: the
  storage numbers trials atomically, so the later number loses) is told FAIL unrun (user attr
  `surplus`); so exactly `n_trials` complete across workers and resumes;
- each worker's sampler has its own seed (`Worker.seed`), so two workers do not propose the same point;
  worker 0 with one worker is the serial search's seed;
- on a storage with heartbeats (an RDB storage, see `search.storage`), each running trial's heartbeat
  is recorded every `heartbeat_interval` seconds; before asking, a worker fails trials whose heartbeat
  is older than the grace period (a killed worker's) and the storage's stale-trial callback enqueues
  them again (`RetryHeartbeatStaleTrialCallback`): the next ask runs that point. A worker whose budget is
  full of other workers' RUNNING trials waits for them to finish or go stale. Without heartbeats (a
  journal file) it stops instead, and the serial pick job completes whatever a lost worker left.

A search can also be run whole by a process of its own that writes nothing (`Worker(part=True)`, the
`thresholds.split_searches` jobs): it runs the search's trials exactly as the serial search would (the
serial seeds), leaving the choice and the outputs to the stage's final serial run, which finds the study
complete. The searches of a stage then spread over processes without changing a trial.

A serial run (one worker, or the pick job after the workers) shares the study with no running process, so
a trial it finds RUNNING was left by one that was killed: it is marked FAIL before the run goes on (a
resumed study shows no trial running forever, and a sampler does not treat its point as pending).
"""

from __future__ import annotations

import contextlib
import logging
import threading
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


def trial_id(storage, study, number: int) -> int:
    """The storage's id of trial `number` of `study` (what its heartbeats are recorded under)."""
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)


@contextlib.contextmanager
def heartbeat(storage, trial_id: int, interval: int | None):
    """Record `trial_id`'s heartbeat now and every `interval` seconds until the block ends (no-op
    without an interval). A process that dies stops beating: its trial goes stale."""
    if not interval:
        yield
        return
    storage.record_heartbeat(trial_id)
    stop = threading.Event()

    def beat():
        while not stop.wait(interval):
            try:
                storage.record_heartbeat(trial_id)
            except Exception as err:  # noqa: BLE001 - a missed beat must not kill the trial; the next one retries
                log.warning("heartbeat of trial %d not recorded: %s", trial_id, err)

    thread = threading.Thread(target=beat, name=f"optuna-heartbeat-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _fail_stale(study) -> None:
    import optuna

    optuna.storages.fail_stale_trials(study)


def run_trials(study, storage, n_trials: int, sampler_for: Callable[[int], object], evaluate: Callable,
               worker: Worker = SERIAL, on_trial: Callable | None = None, poll_s: float | None = None) -> list:
    """Run trials of `study` until it holds `n_trials` COMPLETE ones (or, for a shared worker, until the
    rest are running elsewhere); returns the study's COMPLETE trials (FrozenTrial, by number).

    `sampler_for(completed)`: the sampler of the next trial, given how many have completed (seed it
    with `worker.seed`); `evaluate(trial)`: runs the trial and returns its objective value (it may set
    user attributes and constraints); `on_trial(frozen)`: after each trial this worker completes (a
    progress bar); `storage`: the study's storage object (or URL), for heartbeats; `poll_s`: how long a
    shared worker waits between looks at other workers' running trials (default: the heartbeat interval).
    """
    import optuna

    TrialState = optuna.trial.TrialState
    interval = heartbeat_interval(storage)
    poll_s = poll_s or interval or 5
    if not worker.shared:  # no other process runs this study's trials: a RUNNING one is a stopped process's
        for stopped in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            log.warning("trial %d was left running by a process that stopped: marked failed", stopped.number)
            study.tell(stopped.number, state=TrialState.FAIL)
    while True:
        if interval:
            _fail_stale(study)
        trials = study.get_trials(deepcopy=False)
        complete = sum(t.state == TrialState.COMPLETE for t in trials)
        if complete >= n_trials:
            break
        waiting = any(t.state == TrialState.WAITING for t in trials)
        running = sum(t.state == TrialState.RUNNING for t in trials) if worker.shared else 0
        if complete + running >= n_trials and not waiting:
            if not interval:
                log.info("%s: the remaining %d trial(s) run elsewhere; stopping", worker, n_trials - complete)
                break
            time.sleep(poll_s)  # wait for them to complete, or to go stale and be enqueued again
            continue
        study.sampler = sampler_for(complete)
        trial = study.ask()
        if worker.shared and _surplus(study, trial.number, n_trials):
            trial.set_user_attr("surplus", True)
            study.tell(trial, state=TrialState.FAIL)
            continue
        with heartbeat(storage, trial_id(storage, study, trial.number) if interval else None, interval):
            value = evaluate(trial)
        frozen = study.tell(trial, value, skip_if_finished=True)
        if frozen.state != TrialState.COMPLETE:  # failed as stale meanwhile (a long pause): enqueued again
            log.warning("%s: trial %d was failed as stale by another worker; its point runs again", worker,
                        trial.number)
        elif on_trial is not None:
            on_trial(frozen)
    complete = sorted((t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE),
                      key=lambda t: t.number)
    return complete[:n_trials] if worker.shared else complete


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
