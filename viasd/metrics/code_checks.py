"""Checks of a generated function body (the `stdlib_functions` task): where the body ends, whether it
compiles under its real signature, and whether it passes the function's own doctests.

`compiles` only compiles (nothing runs); `doctest_program` builds a program for the sandbox of
`viasd.metrics.execution`, which imports the function's real stdlib module, replaces the function by
one with the generated body, and runs the doctests of its docstring (exit status 1 on a failure).
"""

from __future__ import annotations

import textwrap


def body_end(text: str, def_indent: int) -> str:
    """`text` (the generated lines after the docstring) cut before the first non-blank line indented
    at most `def_indent` columns: where the function's body ends (trailing blank lines dropped)."""
    out = []
    for line in text.splitlines(keepends=True):
        if line.strip() and len(line) - len(line.lstrip(" \t")) <= def_indent:
            break
        out.append(line)
    body = "".join(out).rstrip()
    return body + "\n" if body else ""


def generated_body(text: str, def_indent: int) -> str:
    """The body a model wrote after a prompt that ends with the docstring's closing quotes: the rest of
    that line is not part of it, the body is `body_end` of the lines after it."""
    return body_end(text.partition("\n")[2], def_indent)


def function_source(header: str, docstring_lines: str, body: str) -> str:
    """A function's source at column 0: `header` (its `def` line(s), dedented), the docstring lines and
    the body as they stand in the file (any common indentation)."""
    inner = textwrap.dedent(docstring_lines + body) if body.strip() else textwrap.dedent(docstring_lines)
    return header + textwrap.indent(inner, "    ")


def compiles(source: str) -> bool:
    """Whether `source` compiles (it is never run)."""
    try:
        compile(source, "<generated>", "exec")
    except (SyntaxError, ValueError):
        return False
    return True


def body_compiles(extra: dict, body: str) -> bool:
    """Whether `body` compiles under the signature of a `stdlib_functions` example (`extra`: its
    `header` and `docstring`)."""
    return compiles(function_source(extra["header"], extra["docstring"], body))


def passes_doctests(extra: dict, body: str, timeout: float = 10.0) -> bool:
    """Whether the example's function (`extra`: `module`, `name`, `header`, `docstring`) with `body`
    passes its docstring's doctests, run in the sandbox of `viasd.metrics.execution`."""
    from .execution import run_program

    source = function_source(extra["header"], extra["docstring"], body)
    return run_program(doctest_program(extra["module"], extra["name"], source), timeout=timeout).passed


def doctest_program(module: str, name: str, source: str) -> str:
    """A program that imports the stdlib `module`, defines `source` (the function `name`) in that
    module's namespace and runs the docstring's doctests; exit status 1 if one fails."""
    return textwrap.dedent(f"""\
        import doctest, importlib, sys
        mod = importlib.import_module({module!r})
        exec(compile({source!r}, "<generated>", "exec"), mod.__dict__)
        fn = mod.__dict__[{name!r}]
        finder, runner = doctest.DocTestFinder(recurse=False), doctest.DocTestRunner(verbose=False)
        for test in finder.find(fn, {name!r}, globs=dict(mod.__dict__)):
            runner.run(test, out=lambda s: None)
        sys.exit(1 if runner.failures or not runner.tries else 0)
        """)
