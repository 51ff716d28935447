"""Running generated code for pass@1, isolated (opt-in: it executes untrusted code).

Each program runs in its own Python process (`-I`: isolated mode) in a fresh temporary directory,
in its own session so the whole process group can be killed, with
- a wall-clock timeout, and CPU-time, address-space (memory) and file-size limits (`resource`);
- an audit hook, installed before the program's first line, that refuses to write, create, delete,
  rename or chmod anything outside its temporary directory, to start processes, or to open network
  connections (the program sees PermissionError).
A program that times out, runs out of memory or is refused is scored as a failure; the caller is
never affected. This is a guard against accidents, not a security boundary against a determined
attacker: run untrusted models' code in a container or VM as well.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

GUARD = r'''
import os, sys, resource
ROOT = os.path.realpath(os.getcwd())
MEM, CPU, FSIZE = (int(x) for x in sys.argv[2:5])
resource.setrlimit(resource.RLIMIT_AS, (MEM, MEM))
resource.setrlimit(resource.RLIMIT_CPU, (CPU, CPU))
resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE, FSIZE))
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

def _inside(path):
    try:
        p = os.path.realpath(os.fsdecode(path) if not isinstance(path, int) else "/proc/self/fd/%d" % path)
    except Exception:
        return False
    return p == ROOT or p.startswith(ROOT + os.sep)

def _hook(event, args):
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags & WRITE_FLAGS)
        if writing and path is not None and not _inside(path):
            raise PermissionError("sandbox: writing outside the sandbox directory is not allowed")
    elif event in ("os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.symlink",
                   "os.link", "shutil.rmtree", "shutil.copyfile", "shutil.move"):
        if not all(_inside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
            raise PermissionError("sandbox: %s outside the sandbox directory is not allowed" % event)
    elif event in ("os.rename", "os.replace"):
        if not (_inside(args[0]) and _inside(args[1])):
            raise PermissionError("sandbox: renaming outside the sandbox directory is not allowed")
    elif event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                   "os.forkpty", "pty.spawn", "socket.connect", "socket.bind", "os.kill", "os.killpg"):
        raise PermissionError("sandbox: %s is not allowed" % event)

sys.addaudithook(_hook)
sys.argv = [sys.argv[1]]
with open(sys.argv[0]) as fh:
    code = compile(fh.read(), sys.argv[0], "exec")
exec(code, {"__name__": "__main__"})
'''


@dataclass(frozen=True)
class ExecResult:
    passed: bool
    status: str  # passed | failed | timeout
    detail: str = ""


def run_program(program: str, timeout: float = 5.0, memory_mb: int = 512, file_mb: int = 8) -> ExecResult:
    """Run `program` isolated; passed iff it exits with status 0 within `timeout` seconds."""
    with tempfile.TemporaryDirectory(prefix="viasd-exec-") as tmp:
        Path(tmp, "program.py").write_text(program)
        Path(tmp, "guard.py").write_text(GUARD)
        cmd = [sys.executable, "-I", "-S", "guard.py", "program.py", str(memory_mb << 20),
               str(int(timeout) + 1), str(file_mb << 20)]
        env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "HOME": tmp, "TMPDIR": tmp}
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return ExecResult(False, "timeout", f"killed after {timeout:g}s")
        if proc.returncode == 0:
            return ExecResult(True, "passed")
        lines = err.decode(errors="replace").strip().splitlines()
        return ExecResult(False, "failed", lines[-1] if lines else f"exit status {proc.returncode}")


def humaneval_program(prompt: str, completion: str, test: str, entry_point: str) -> str:
    """The program HumanEval runs: prompt + completion, then the tests, then `check(entry_point)`."""
    return f"{prompt}{completion}\n\n{test}\n\ncheck({entry_point})\n"


def truncate_completion(text: str, stops) -> str:
    """Cut a completion at the first stop string (the text after the function body)."""
    cut = len(text)
    for stop in stops:
        idx = text.find(stop)
        if idx != -1:
            cut = min(cut, idx)
    return text[:cut]


def pass_at_1(examples, completions: list[str], stops=(), timeout: float = 5.0) -> dict:
    """Share of HumanEval-style examples whose completion passes its tests (one sample each)."""
    results = []
    for example, completion in zip(examples, completions):
        program = humaneval_program(example.extra["full_prompt"], truncate_completion(completion, stops),
                                    example.extra["test"], example.extra["entry_point"])
        results.append(run_program(program, timeout=timeout))
    return {"pass_at_1": sum(r.passed for r in results) / max(len(results), 1),
            "statuses": [r.status for r in results]}
