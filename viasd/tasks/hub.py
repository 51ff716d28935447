"""Hub tasks with the paper's kinds of work, loaded through `datasets.load_dataset` with their usual
configs. Each can be pointed at a local copy in `params.yaml`:

    tasks:
      cnn_dailymail:
        source: {path: json, data_files: {test: /data/cnn_dm/test.jsonl}}

The local files must have the hub dataset's schema (the same column names). `tasks.<name>.template`
replaces the built-in prompt by a format string over the row's fields, for models trained on a prompt
format of their own (T5: `"summarize: {article}"`, `"translate German to English: {de}"`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from .base import Example, TaskError, TaskSpec
from .builtin import HUMANEVAL_STOPS


@dataclass(frozen=True)
class HubTask:
    spec: TaskSpec
    source: dict  # load_dataset kwargs: path, name
    splits: dict  # our split -> the dataset's split
    make: Callable[[dict, int], Example]


def _summ(doc_key: str, ref_key: str, prefix: str):
    return lambda row, i: Example(id=str(row.get("id", i)), prompt=f"{prefix}{row[doc_key]}\nSummary:",
                                  reference=row[ref_key])


def _wmt(row, i):
    pair = row["translation"]
    return Example(id=str(i), prompt=f"Translate German to English.\nGerman: {pair['de']}\nEnglish:", reference=pair["en"])


def _gsm8k(row, i):
    return Example(id=str(i), prompt=f"Question: {row['question']}\nAnswer:", reference=row["answer"])


def _nq(row, i):
    answers = row["answer"] if isinstance(row["answer"], list) else [row["answer"]]
    return Example(id=str(i), prompt=f"Question: {row['question']}?\nAnswer:", reference=answers[0],
                   extra={"answers": list(answers)})


def _humaneval(row, i):
    return Example(id=row["task_id"], prompt=row["prompt"], reference=row["canonical_solution"],
                   extra={"test": row["test"], "entry_point": row["entry_point"], "full_prompt": row["prompt"]})


HUB_TASKS = {
    "cnn_dailymail": HubTask(TaskSpec("cnn_dailymail", ("rouge", "agreement", "nll"), ("\n\n",)),
                             {"path": "abisee/cnn_dailymail", "name": "3.0.0"},
                             {"dev": "validation", "test": "test"}, _summ("article", "highlights", "Article: ")),
    "xsum": HubTask(TaskSpec("xsum", ("rouge", "agreement", "nll"), ("\n",)),
                    {"path": "EdinburghNLP/xsum"}, {"dev": "validation", "test": "test"},
                    _summ("document", "summary", "Document: ")),
    "wmt14_de_en": HubTask(TaskSpec("wmt14_de_en", ("bleu", "chrf", "agreement", "nll"), ("\n",)),
                           {"path": "wmt/wmt14", "name": "de-en"}, {"dev": "validation", "test": "test"}, _wmt),
    "gsm8k": HubTask(TaskSpec("gsm8k", ("gsm8k_accuracy", "agreement", "nll"), ("\nQuestion:", "\n\n")),
                     {"path": "openai/gsm8k", "name": "main"}, {"dev": "train", "test": "test"}, _gsm8k),
    "natural_questions": HubTask(TaskSpec("natural_questions", ("exact_match", "agreement", "nll"), ("\n",)),
                                 {"path": "google-research-datasets/nq_open"},
                                 {"dev": "train", "test": "validation"}, _nq),
    "openai_humaneval": HubTask(TaskSpec("openai_humaneval", ("pass_at_1", "agreement", "nll"), HUMANEVAL_STOPS),
                                {"path": "openai/openai_humaneval"}, {"dev": "test", "test": "test"}, _humaneval),
}


def row_fields(row: dict) -> dict:
    """A row's fields for a prompt template: its columns, with a nested dict's keys lifted (WMT's
    `translation: {de, en}` gives `{de}` and `{en}`)."""
    out = {}
    for key, value in row.items():
        out[key] = value
        if isinstance(value, dict):
            out.update(value)
    return out


def apply_template(name: str, template: str, row: dict) -> str:
    """`template` (`str.format` over `row_fields`), e.g. T5's `"summarize: {article}"`; a field the row
    does not have is a one-line error naming it and the fields there are."""
    fields = row_fields(row)
    try:
        return template.format(**fields)
    except KeyError as err:
        raise TaskError(f"tasks.{name}.template: the data has no field {err.args[0]!r} "
                        f"(fields: {', '.join(sorted(fields))})") from None
    except (IndexError, ValueError) as err:
        raise TaskError(f"tasks.{name}.template {template!r} is not a valid format string: {err}") from None


def hub_examples(name: str, split: str, n: int, source: dict | None = None,
                 template: str | None = None) -> list[Example]:
    """The first `n` examples of `split` (`dev` or `test`) of a hub task, from the hub or `source`; with
    `template`, its prompt is the template filled from each row (models trained on a prompt format of
    their own, such as T5's `summarize:` and `translate German to English:` prefixes)."""
    task = HUB_TASKS[name]
    kwargs = dict(source) if source else dict(task.source)
    local = source is not None
    hub_split = task.splits[split]
    if local and "data_files" in kwargs and isinstance(kwargs["data_files"], dict):
        hub_split = split if split in kwargs["data_files"] else hub_split
    try:
        from datasets import load_dataset

        data = load_dataset(**kwargs, split=hub_split)
    except Exception as err:  # the datasets library raises many types for an unreachable hub
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        if local:
            raise TaskError(f"task {name}: cannot load the local source {kwargs}: {first}") from None
        raise TaskError(
            f"task {name}: cannot load '{kwargs['path']}' from the Hugging Face Hub ({first}). Offline? Put a copy "
            f"in the hub schema on disk and set tasks.{name}.source: {{path: json, data_files: {{{split}: FILE}}}} "
            "in params.yaml"
        ) from None
    rows = data.select(range(min(n, len(data))))
    if split == "dev" and task.splits["dev"] == task.splits["test"] and not local:
        rows = data.select(range(len(data) - min(n, len(data)), len(data)))  # disjoint from test's first rows
    missing = _missing_columns(name, data.column_names)
    if missing:
        raise TaskError(f"task {name}: the data has no column {missing!r} (columns: {', '.join(data.column_names)})")
    examples = [task.make(row, i) for i, row in enumerate(rows)]
    if template is not None:
        examples = [replace(e, prompt=apply_template(name, template, row)) for e, row in zip(examples, rows)]
    return examples


_COLUMNS = {"cnn_dailymail": ("article", "highlights"), "xsum": ("document", "summary"),
            "wmt14_de_en": ("translation",), "gsm8k": ("question", "answer"),
            "natural_questions": ("question", "answer"),
            "openai_humaneval": ("task_id", "prompt", "canonical_solution", "test", "entry_point")}


def _missing_columns(name: str, columns) -> str | None:
    for col in _COLUMNS[name]:
        if col not in columns:
            return col
    return None


def gsm8k_final_answer(text: str) -> str | None:
    """The number after '####' (the reference format), else the last number in the text."""
    match = re.search(r"####\s*(-?[\d,\.]+)", text)
    if match is None:
        numbers = re.findall(r"-?\d[\d,]*\.?\d*", text)
        if not numbers:
            return None
        value = numbers[-1]
    else:
        value = match.group(1)
    return value.replace(",", "").rstrip(".")
