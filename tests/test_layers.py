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
    assert "viasd.decoding.slim" in graph["viasd.decoding.reuse"]
    assert not cycles(graph)


def test_no_function_over_80_lines():
    long = [(str(p.relative_to(PACKAGE)), node.name, node.end_lineno - node.lineno + 1)
            for p in sorted(PACKAGE.rglob("*.py")) for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80]
    assert not long, f"functions over 80 lines: {long}"


def test_the_import_reader_resolves_relative_imports():
    """The checks above see what they claim: a relative sibling import inside `stages` reads as
    `viasd.stages.<module>`, and a private name is listed."""
    found = dict(imports(PACKAGE / "stages" / "decode.py"))
    assert "viasd.study.cells" in found and "viasd.config" in found
    probe = PACKAGE / "stages" / "_probe_for_test.py"
    probe.write_text("from .decode import _private\nfrom ..study import paths\n")
    try:
        assert list(imports(probe)) == [("viasd.stages.decode", ["_private"]), ("viasd.study", ["paths"])]
    finally:
        probe.unlink()


def test_the_package_root_holds_few_modules_and_every_package_says_what_it_holds():
    """The layout a newcomer reads (README, "Layout"): concepts live in packages, the root keeps at most five
    modules (the public API, errors, files, model loading, parameters), and each package's docstring says
    what it holds."""
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= 5, root
    for init in sorted(PACKAGE.rglob("__init__.py")):
        if "modules" in init.parts:  # the `evaluate` metric modules are data, not packages of ours
            continue
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc) > 40, f"{init.relative_to(PACKAGE)} has no docstring saying what it holds"


def test_every_study_stage_has_its_module():
    """One module per stage of the study, named as the stage (the Snakemake rule and the `viasd` subcommand)."""
    stages = {p.stem for p in (PACKAGE / "stages").glob("*.py")} - {"__init__"}
    assert stages == {"prepare_data", "train_model", "train_drafter", "dimr_search", "train_router", "tune_thresholds",
                      "decode", "batch_table", "evaluate", "report"}


def test_dvc_stages_depend_on_the_code_their_commands_import(tmp_path):
    """Each DVC stage's `viasd/...` deps cover every module its command imports (tools/code_deps.py), so an edit
    to any of them makes `dvc repro` re-run the stage; and the check sees a dep that is missing."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("code_deps", PACKAGE.parent / "tools" / "code_deps.py")
    code_deps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(code_deps)
    assert code_deps.missing() == {}, "python tools/code_deps.py --write"
    assert "viasd/search/pass_cost.py" in code_deps.stage_code("viasd report")
    assert "viasd/evaluation" in code_deps.stage_code("viasd decode --pair p --task t")
    text = (PACKAGE.parent / "dvc.yaml").read_text()
    dropped = tmp_path / "dvc.yaml"
    dropped.write_text(text.replace("      - viasd/search/pass_cost.py\n", "", 1))
    assert "viasd/search/pass_cost.py" in [f for files in code_deps.missing(dropped).values() for f in files]


def test_the_report_front_page_names_the_rules_and_every_report_output_has_a_caption():
    """workflow/report/workflow.rst (the Snakemake report's front page) names every rule of workflow/rules/ and no
    other; every `report(...)` output of a rule has a caption file that exists."""
    import re

    root = PACKAGE.parent / "workflow"
    rules = {m for f in (root / "rules").glob("*.smk") for m in re.findall(r"^rule (\w+):", f.read_text(), re.M)}
    named = set(re.findall(r"``(\w+)``", (root / "report" / "workflow.rst").read_text()))
    assert rules <= named, f"rules missing from the report's front page: {sorted(rules - named)}"
    stray = {n for n in named - rules if n.islower() and "_" in n and not n.startswith(("dimr.", "thresholds."))}
    assert not stray - {"metrics_json"}, f"the front page names rules that do not exist: {sorted(stray)}"
    calls = 0
    for f in (root / "rules").glob("*.smk"):
        text = f.read_text()
        for start in (m.end() for m in re.finditer(r"\breport\(", text)):
            depth, end = 1, start
            while depth:
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                end += 1
            caption = re.search(r'caption="([^"]+)"', text[start:end])
            assert caption, f"{f.name}: a report() output without a caption"
            assert (f.parent / caption.group(1)).resolve().is_file(), caption.group(1)
            calls += 1
    assert calls >= 6


def test_an_old_module_path_still_imports_with_a_deprecation_warning():
    """Modules moved by the layout keep working from their old paths for now, saying where they went."""
    import importlib
    import sys
    import warnings

    import viasd

    for old, new in viasd.MOVED_MODULES.items():
        sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        assert module is importlib.import_module(new)
        assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught), old
        sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from viasd.evaluation import task_quality
    assert task_quality is importlib.import_module("viasd.evaluation.side_by_side").task_quality and caught
