"""Decoding a task's examples with one policy, and the quality every run reports.

Pure library code: models, examples and a policy in; per-example outputs and summed statistics out.
"""

from __future__ import annotations

from dataclasses import replace

from .decoding.policy import DecodePolicy
from .decoding.stats import DecodeStats
from .models import ModelSet
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


def decode_against_ar(models: ModelSet, examples: list[Example], policy: DecodePolicy, task: TaskSpec | None = None,
                      progress: bool = True, warmup_tokens: int = 8) -> tuple[list[dict], DecodeStats, DecodeStats]:
    """Decode every example with `policy` and with greedy `ar` on the same target, side by side.

    The two alternate which goes first from one example to the next so that both see the same machine
    state, after a short warm-up of each. Rows carry the method's output plus the `ar` tokens (the
    target's own greedy output, the reference for agreement) and both wall times. Returns
    (rows, merged method statistics, merged `ar` statistics).
    """
    from tqdm.auto import tqdm

    stops = tuple(dict.fromkeys(policy.stop_strings + (task.stop_strings if task else ())))
    policy = replace(policy, stop_strings=stops)
    reference = DecodePolicy(method="ar", max_new_tokens=policy.max_new_tokens, stop_strings=stops,
                             eos_token_ids=policy.eos_token_ids)
    prompts = [e.prompt_ids if e.prompt_ids is not None else models.encode(e.prompt) for e in examples]
    if prompts and warmup_tokens:
        for warm in (reference, policy):
            models.generate(prompts[0], replace(warm, max_new_tokens=min(warmup_tokens, warm.max_new_tokens)))
    rows, parts, ar_parts = [], [], []
    for i, (example, prompt) in enumerate(tqdm(list(zip(examples, prompts)), desc=f"decode {policy.method} vs ar",
                                               disable=not progress, leave=False)):
        order = (reference, policy) if i % 2 == 0 else (policy, reference)
        results = {id(p): models.generate(prompt, p) for p in order}
        ours, ar = results[id(policy)], results[id(reference)]
        rows.append({"id": example.id, "token_ids": ours.token_ids, "text": ours.text, "stats": ours.stats.as_dict(),
                     "ar_token_ids": ar.token_ids, "ar_wall_time_s": ar.stats.wall_time_s})
        parts.append(ours.stats)
        ar_parts.append(ar.stats)
    return rows, DecodeStats.merge(parts), DecodeStats.merge(ar_parts)


def metric_score(task: TaskSpec, metric: str, examples: list[Example], texts: list[str | None]) -> float | None:
    """One metric of `task` for `texts` (aligned with `examples`), e.g. the main metric of another output."""
    rows = [{"text": t or "", "token_ids": []} for t in texts]
    return task_quality(replace(task, metrics=(metric,)), examples, rows).get(metric)


def task_quality(task: TaskSpec, examples: list[Example], rows: list[dict], models: ModelSet | None = None) -> dict:
    """The task's quality metrics for decoded `rows` (aligned with `examples`).

    `agreement` is position-wise agreement with the target's greedy output (`ar_token_ids`, else the
    row's own tokens for `ar` itself); `nll` is the target's mean negative log-likelihood of the
    output (nats/token, needs `models`); `pass_at_1` runs the HumanEval tests in a sandboxed process;
    `compiles` and `doctest_pass` check generated function bodies (`viasd.metrics.code_checks`); the
    rest are text metrics from `viasd.metrics`. Examples that carry a `def_indent` (function bodies)
    are scored on the body the output holds, cut where its indentation returns to the `def`'s.
    """
    from .metrics.code_checks import body_compiles, generated_body, passes_doctests
    from .metrics.execution import pass_at_1
    from .metrics.model_metrics import agreement, target_nll
    from .metrics.text_metrics import compute

    texts = [generated_body(row["text"] or "", e.extra["def_indent"]) if "def_indent" in e.extra else row["text"] or ""
             for e, row in zip(examples, rows)]
    out: dict = {}
    for name in task.metrics:
        if name == "agreement":
            scores = [agreement(r["token_ids"], r.get("ar_token_ids", r["token_ids"])) for r in rows]
            out["agreement"] = sum(scores) / max(len(scores), 1)
        elif name == "nll":
            if models is None:
                continue
            total = count = 0.0
            for example, row in zip(examples, rows):
                prompt = example.prompt_ids if example.prompt_ids is not None else models.encode(example.prompt)
                nll = target_nll(models.target, prompt, row["token_ids"], models.vocab_size)
                if nll is not None:
                    total += nll * len(row["token_ids"])
                    count += len(row["token_ids"])
            out["nll"] = total / count if count else None
        elif name == "compiles":
            ok = [body_compiles(e.extra, t) for e, t in zip(examples, texts)]
            out["compiles"] = sum(ok) / max(len(ok), 1)
        elif name == "doctest_pass":
            runs = [passes_doctests(e.extra, t) for e, t in zip(examples, texts) if e.extra.get("doctest")]
            out["doctest_pass"] = sum(runs) / len(runs) if runs else None
        elif name == "pass_at_1":
            out["pass_at_1"] = pass_at_1(examples, texts, task.stop_strings)["pass_at_1"]
        elif name == "exact_match":
            refs = [e.extra.get("answers", [e.reference]) for e in examples]
            out.update(compute(name, texts, refs))
        else:
            out.update(compute(name, texts, [e.reference for e in examples]))
    return out
