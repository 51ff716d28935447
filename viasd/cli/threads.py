"""CPU threads of a `viasd` process: never more than the cores it was given nor than it may run on.

A Snakemake job exports `OMP_NUM_THREADS` = the threads it was granted (`{threads}`, already capped at
`--cores`); a SLURM job's CPU affinity is its allocation. torch otherwise starts one thread per core of
the machine in every process, so jobs running side by side would oversubscribe the cores.
"""

from __future__ import annotations

import os


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity: a cgroup or `taskset` limit counts)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def thread_budget(environ=os.environ) -> int:
    """`OMP_NUM_THREADS` when set (a positive integer), capped at the available cores; else the cores."""
    cores = available_cores()
    raw = environ.get("OMP_NUM_THREADS", "").strip()
    try:
        requested = int(raw)
    except ValueError:
        requested = cores
    return max(1, min(requested if requested > 0 else cores, cores))


def limit_threads() -> int:
    """Limit this process to `thread_budget()` threads; returns it. Before torch is imported this only
    sets `OMP_NUM_THREADS` (torch reads it on import), so commands that never load a model stay fast."""
    import sys

    n = thread_budget()
    os.environ["OMP_NUM_THREADS"] = str(n)
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
