"""The study ring's shape, kept by reading the imports (like the decoding library's purity check):
stage modules import the study layer and the libraries below it, never each other, and no module
imports another module's private names."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "viasd"


def imports(path: Path):
    """(module imported, names) of every import in `path`, relative imports resolved against its package."""
    package = list(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            yield module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []


def test_stage_modules_never_import_each_other():
    stages = sorted((PACKAGE / "stages").glob("*.py"))
    assert len(stages) >= 7
    offending = [(p.name, module) for p in stages for module, names in imports(p)
                 if module.startswith("viasd.stages") or (module == "viasd.stages" and names)]
    assert not offending, f"stage modules import other stages: {offending}"


def test_no_private_name_is_imported_from_another_module():
    offending = [(str(p.relative_to(PACKAGE)), module, name) for p in sorted(PACKAGE.rglob("*.py"))
                 for module, names in imports(p) for name in names
                 if name.startswith("_") and not name.startswith("__") and module.startswith("viasd")]
    assert not offending, f"private names imported across modules: {offending}"


def module_graph() -> dict[str, set[str]]:
    """viasd's modules and the viasd modules each imports, function-level imports included."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        deps = set()
        for module, names in imports(path):
            deps |= {f"{module}.{n}" if f"{module}.{n}" in modules else module for n in names} if names else {module}
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check sees one
    graph = module_graph()
    assert "viasd.decoding.routing" in graph["viasd.decoding.reuse"]
    assert not cycles(graph)


def test_no_function_over_80_lines():
    long = [(str(p.relative_to(PACKAGE)), node.name, node.end_lineno - node.lineno + 1)
            for p in sorted(PACKAGE.rglob("*.py")) for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80]
    assert not long, f"functions over 80 lines: {long}"


def test_the_import_reader_resolves_relative_imports():
    """The checks above see what they claim: a relative sibling import inside `stages` reads as
    `viasd.stages.<module>`, and a private name is listed."""
    found = dict(imports(PACKAGE / "stages" / "decode_stage.py"))
    assert "viasd.study.cells" in found and "viasd.config" in found
    probe = PACKAGE / "stages" / "_probe_for_test.py"
    probe.write_text("from .bench_stage import _private\nfrom ..study import paths\n")
    try:
        assert list(imports(probe)) == [("viasd.stages.bench_stage", ["_private"]), ("viasd.study", ["paths"])]
    finally:
        probe.unlink()
