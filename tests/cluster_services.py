"""Real services for the cluster tests, started from Debian's packages on this machine (as root): a
one-node SLURM cluster (munged, slurmctld, slurmd), a PostgreSQL server, and an `mlflow server` on it.
Each runs from a temp folder on free ports and is stopped when its fixture ends."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, what: str, timeout: float = 60, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the process ended ({proc.returncode})")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not ready after {timeout:.0f} s")
        time.sleep(0.5)


def require(*programs: str) -> None:
    """Skip unless these programs are installed and this is root (`.ci/run` installs them)."""
    missing = [p for p in programs if not shutil.which(p) and not os.path.exists(p)]
    if missing or os.geteuid() != 0:
        pytest.skip(f"needs root and {', '.join(missing) or 'its services'} (`.ci/run` installs them)")


# ---------------------------------------------------------------- SLURM ----------------------------

SYSTEM_CONF = Path("/etc/slurm/slurm.conf")  # where every SLURM command, srun inside a job too, looks
MARK = "# written by viasd's tests/cluster_services.py: a one-node test cluster"
SLURM_CONF = MARK + """
ClusterName=viasdtest
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# no accounting (no sacct): squeue answers for finished jobs this long
MinJobAge=3600
KillWait=10
SlurmdParameters=config_overrides
NodeName={host} CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _munge() -> None:
    """munged, as Debian's package runs it (user munge), unless one already answers."""
    if subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
        return
    if not Path("/etc/munge/munge.key").exists():
        subprocess.run(["mungekey", "--create"], check=True)
        shutil.chown("/etc/munge/munge.key", "munge", "munge")
        os.chmod("/etc/munge/munge.key", 0o400)
    for folder in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
        os.makedirs(folder, exist_ok=True)
        shutil.chown(folder, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)
    wait_for(lambda: subprocess.run(["munge", "-n"], capture_output=True).returncode == 0, "munged")


def start_slurm(folder: Path) -> dict:
    """A one-node cluster of this machine (its cores; memory is not a consumable resource), configured in
    /etc/slurm/slurm.conf as a cluster's nodes are (`srun` inside a job reads it there); returns the
    environment its clients need (SLURM_CONF)."""
    _munge()
    folder.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool"):
        (folder / sub).mkdir(exist_ok=True)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    conf = SYSTEM_CONF
    if conf.exists() and not conf.read_text().startswith(MARK):
        pytest.skip(f"{conf} configures another cluster")
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(SLURM_CONF.format(host=socket.gethostname().split(".")[0], ctld_port=free_port(),
                                      slurmd_port=free_port(), dir=folder, cpus=os.cpu_count(), memory=memory))
    env = {"SLURM_CONF": str(conf)}
    full = {**os.environ, **env}
    subprocess.run(["slurmctld", "-f", str(conf)], check=True, env=full)
    subprocess.run(["slurmd", "-f", str(conf)], check=True, env=full)

    def idle():
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=full).stdout
        return out.strip() in ("idle", "mixed", "allocated")

    wait_for(idle, "the SLURM node")
    return env


def stop_slurm(folder: Path) -> None:
    for name in ("slurmd", "slurmctld"):
        pid_file = folder / f"{name}.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass


def slurm_jobs(env: dict) -> list[dict]:
    """The jobs squeue knows (running, pending and finished within MinJobAge): id, name, state, comment."""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%j|%T|%k"], capture_output=True, text=True,
                         env={**os.environ, **env}, check=True).stdout
    return [dict(zip(("id", "name", "state", "comment"), line.split("|", 3))) for line in out.splitlines() if line]


# ---------------------------------------------------------------- PostgreSQL, MLflow ---------------


def start_postgres(folder: Path) -> tuple[str, subprocess.Popen | None]:
    """A PostgreSQL server of Debian's package on a free port (trust auth on loopback); returns its
    base URL `postgresql://postgres@127.0.0.1:PORT`."""
    bindir = Path(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))[-1]).parent
    folder.mkdir(parents=True, exist_ok=True)
    shutil.chown(folder, "postgres", "postgres")
    data = folder / "data"
    as_postgres = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*as_postgres, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"],
                   check=True, capture_output=True)
    port = free_port()
    subprocess.run([*as_postgres, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-w", "start",
                    "-o", f"-p {port} -k {folder} -c listen_addresses=127.0.0.1"], check=True, capture_output=True)
    return f"postgresql://postgres@127.0.0.1:{port}", bindir


def stop_postgres(folder: Path, bindir: Path) -> None:
    subprocess.run(["runuser", "-u", "postgres", "--", str(bindir / "pg_ctl"), "-D", str(folder / "data"), "-m", "fast",
                    "stop"], capture_output=True)


def create_database(url: str, name: str) -> str:
    """A new database on the server at `url`; returns its URL."""
    import psycopg2

    conn = psycopg2.connect(f"{url}/postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    return f"{url}/{name}"


def start_mlflow_server(bin_dir: Path, backend: str, artifacts: Path, port: int, log: Path) -> subprocess.Popen:
    """`mlflow server` on the `backend` store, serving artifacts from `artifacts`, on 127.0.0.1:`port`."""
    import urllib.request

    proc = subprocess.Popen([str(bin_dir / "mlflow"), "server", "--backend-store-uri", backend,
                             "--artifacts-destination", str(artifacts), "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1"], stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            start_new_session=True)

    def up():
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200
        except OSError:
            return False

    wait_for(up, "mlflow server", timeout=120, proc=proc)
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
