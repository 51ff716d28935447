"""Decoding a task's examples with one policy, and the quality every run reports.

Pure library code: models, examples and a policy in; per-example outputs and summed statistics out.
"""

from __future__ import annotations

from dataclasses import replace

from .models import ModelSet
from .policy import DecodePolicy
from .stats import DecodeStats
from .tasks.base import Example, TaskSpec


def decode_examples(models: ModelSet, examples: list[Example], policy: DecodePolicy, task: TaskSpec | None = None,
                    progress: bool = True) -> tuple[list[dict], DecodeStats]:
    """Decode every example; returns rows `{id, token_ids, text, stats}` and the merged statistics.

    The task's stop strings are added to the policy's; prompts cut from a token stream are decoded
    from their exact ids.
    """
    from tqdm.auto import tqdm

    if task is not None and task.stop_strings:
        policy = replace(policy, stop_strings=tuple(dict.fromkeys(policy.stop_strings + task.stop_strings)))
    rows, parts = [], []
    for example in tqdm(examples, desc=f"decode {policy.method}", disable=not progress, leave=False):
        prompt = example.prompt_ids if example.prompt_ids is not None else models.encode(example.prompt)
        result = models.generate(prompt, policy)
        rows.append({"id": example.id, "token_ids": result.token_ids, "text": result.text,
                     "stats": result.stats.as_dict()})
        parts.append(result.stats)
    return rows, DecodeStats.merge(parts)
