"""The code dependencies of each DVC stage, derived from what its `viasd` command imports.

A stage's command `viasd <subcommand>` runs the stage's module `viasd/stages/<subcommand>.py` through the
command line's dispatch (`viasd/cli`: its own files). The stage's code is its module and every viasd module it
imports, transitively (imports inside functions included: they run too), every package `__init__` on the way,
and the package data they read (the params schema, the `evaluate` metric modules). Two imports are not
followed, since they decide no output: the command line's parsers (which read names such as the cache kinds
for their choices) and the package root's re-exports of the public API. A package all of whose modules are
needed is listed as its directory, else its modules one by one.

    python tools/code_deps.py            # print each stage's code deps
    python tools/code_deps.py --check    # exit 1 if a stage of dvc.yaml misses one (tests/test_layers.py runs it)
    python tools/code_deps.py --write    # rewrite the `viasd/...` lines of every stage's deps in dvc.yaml

So editing any module a stage runs makes `dvc repro` re-run that stage, and only those stages.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "viasd"
CLI = ("viasd/cli/__init__.py", "viasd/cli/common.py", "viasd/cli/stages.py", "viasd/cli/threads.py")
NOT_FOLLOWED = {"viasd"}  # the package root: re-exports of the public API
# package data a module reads from disk: module -> paths relative to the repository
DATA = {"viasd.config": ["viasd/schemas"], "viasd.metrics.module_base": ["viasd/metrics/modules"]}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its `__init__.py`)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        if "modules" in path.relative_to(PACKAGE).parts:  # the `evaluate` metric modules: data (DATA)
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The viasd modules `name` imports anywhere in its body, with the packages they sit in (whose
    `__init__` runs first)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found |= {f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    parents = {".".join(m.split(".")[:k]) for m in found for k in range(1, m.count(".") + 1)}
    return {m for m in found | parents if m in known}


def closure(starts, known: dict[str, Path]) -> set[str]:
    seen, todo = set(), list(starts)
    while todo:
        m = todo.pop()
        if m in seen or m not in known:
            continue
        seen.add(m)
        if m not in NOT_FOLLOWED:
            todo += imports(m, known[m], known)
    return seen


def stage_module(cmd: str) -> str:
    """`viasd decode --pair ...` -> `viasd.stages.decode`."""
    words = cmd.split()
    if words[:1] != ["viasd"] or len(words) < 2:
        raise ValueError(f"not a viasd command: {cmd!r}")
    return f"viasd.stages.{words[1].replace('-', '_')}"


def files_of(names: set[str], known: dict[str, Path]) -> set[str]:
    files = {str(known[n].relative_to(ROOT)) for n in names} | set(CLI)
    for n in names:
        files |= set(DATA.get(n, []))
    return files


def compress(files: set[str]) -> list[str]:
    """The files as the fewest paths: a directory all of whose modules are needed stands for them (and for the
    data under it)."""
    out = set(files)
    dirs = sorted({p for f in files for p in Path(f).parents if p.parts[:1] == ("viasd",)}, key=lambda p: -len(p.parts))
    for d in dirs:
        inside = {str(p.relative_to(ROOT)) for p in (ROOT / d).rglob("*.py") if "modules" not in p.parts}
        covered = {x for x in out if x == str(d) or x.startswith(f"{d}/")}
        if inside and inside <= covered | {y for x in covered for y in inside if y.startswith(f"{x}/")}:
            out = (out - covered) | {str(d)}
    return sorted(out)


def stage_code(cmd: str) -> list[str]:
    known = modules()
    return compress(files_of(closure([stage_module(cmd)], known), known))


def dvc_stages(path: Path = ROOT / "dvc.yaml") -> dict[str, dict]:
    return yaml.safe_load(path.read_text())["stages"]


def stage_cmd(stage: dict) -> str:
    return (stage.get("do") or stage)["cmd"]


def stage_deps(stage: dict) -> list[str]:
    return (stage.get("do") or stage)["deps"]


def missing(path: Path = ROOT / "dvc.yaml") -> dict[str, list[str]]:
    """Per stage of dvc.yaml, the code files its command runs that no dep covers."""
    known = modules()
    out = {}
    for name, stage in dvc_stages(path).items():
        needed = files_of(closure([stage_module(stage_cmd(stage))], known), known)
        deps = [d.rstrip("/") for d in stage_deps(stage) if d.startswith("viasd")]
        lost = sorted(f for f in needed if not any(f == d or f.startswith(f"{d}/") for d in deps))
        if lost:
            out[name] = lost
    return out


def write(path: Path = ROOT / "dvc.yaml") -> None:
    """Replace the `- viasd/...` lines of each stage's deps by the derived list (comments and layout kept)."""
    stages = dvc_stages(path)
    lines, out, stage, replaced = path.read_text().split("\n"), [], None, set()
    for line in lines:
        stripped = line.strip()
        if line.startswith("  ") and not line.startswith("   ") and stripped.endswith(":") and stripped[:-1] in stages:
            stage = stripped[:-1]
        if stripped.startswith("- viasd") and stage is not None:
            if stage not in replaced:
                indent = line[: len(line) - len(line.lstrip())]
                out += [f"{indent}- {f}" for f in stage_code(stage_cmd(stages[stage]))]
                replaced.add(stage)
            continue
        out.append(line)
    text = "\n".join(out)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main(argv: list[str]) -> int:
    if "--write" in argv:
        write()
    if "--check" in argv:
        lost = missing()
        for stage, files in lost.items():
            print(f"dvc.yaml: stage {stage} does not depend on {', '.join(files)} (python tools/code_deps.py --write)")
        return 1 if lost else 0
    if not argv:
        for name, stage in dvc_stages().items():
            print(f"{name}: {' '.join(stage_code(stage_cmd(stage)))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
