"""Decoding a task's examples with one policy, and the quality every run reports.

Pure library code: models, examples and a policy in; per-example outputs and summed statistics out.
"""

from __future__ import annotations

from dataclasses import replace

from ..decoding.policy import DecodePolicy
from ..decoding.stats import DecodeStats
from ..models import ModelSet
from ..tasks.base import Example, TaskSpec
from .run_order import interleaved


def decode_side_by_side(models: ModelSet, reference: DecodePolicy, cells: dict[str, tuple[ModelSet, DecodePolicy]],
                        examples: list[Example], task: TaskSpec | None = None, progress: bool = True,
                        warmup_tokens: int = 8) -> tuple[dict[str, list[dict]], dict[str, DecodeStats], list[dict], DecodeStats]:
    """Decode every example once with the `reference` policy (greedy `ar`) on `models` and with each
    cell's `(models, policy)`, side by side: for each example the reference and every cell run one after
    another, in the balanced order of `run_order.interleaved` (each run in each place, and right after each
    other run, equally often over consecutive examples), so that all see the same machine state (after a
    short warm-up of each). An oracle cell (`router: oracle`) decodes in that order too, with its own peek
    passes, which its statistics time apart (`DecodeStats.peek_time_s`, outside its wall time). The task's
    stop strings are added to every policy's.

    Returns (rows per cell, merged statistics per cell, the reference's rows, its merged statistics).
    Rows are `{id, token_ids, text, stats}`; a cell's rows also carry the reference's tokens
    (`ar_token_ids`: the target's own greedy output, the reference for agreement), its wall time and its
    decode time (prefill apart) on the same example, and its token count (`ar_wall_time_s`,
    `ar_decode_time_s`, `ar_new_tokens`: the paired speed ratios of `metrics.speed`).
    """
    from tqdm.auto import tqdm

    if not examples:
        raise ValueError("no examples to decode")
    stops = tuple(task.stop_strings) if task is not None else ()

    def with_stops(policy: DecodePolicy) -> DecodePolicy:
        return replace(policy, stop_strings=tuple(dict.fromkeys(policy.stop_strings + stops)))

    entries = [(None, models, with_stops(reference))] + [(name, m, with_stops(p)) for name, (m, p) in cells.items()]
    prompts = [e.prompt_ids if e.prompt_ids is not None else models.encode(e.prompt) for e in examples]
    if prompts and warmup_tokens:
        for _, m, policy in entries:
            m.generate(prompts[0], replace(policy, max_new_tokens=min(warmup_tokens, policy.max_new_tokens)))
    rows: dict[str, list[dict]] = {name: [] for name in cells}
    parts: dict[str, list[DecodeStats]] = {name: [] for name in cells}
    ref_rows, ref_parts = [], []
    with tqdm(total=len(examples) * len(entries), desc=f"decode ar + {len(cells)} runs", disable=not progress,
              leave=False) as bar:
        for i, (example, prompt) in enumerate(zip(examples, prompts)):
            results = {}
            for name, m, policy in interleaved(entries, 0, i):
                results[name] = m.generate(prompt, policy)
                bar.update()
            ref = results.pop(None)
            ref_rows.append({"id": example.id, "token_ids": ref.token_ids, "text": ref.text, "stats": ref.stats.as_dict()})
            ref_parts.append(ref.stats)
            for name, ours in results.items():
                rows[name].append({"id": example.id, "token_ids": ours.token_ids, "text": ours.text,
                                   "stats": ours.stats.as_dict(), "ar_token_ids": ref.token_ids,
                                   "ar_wall_time_s": ref.stats.wall_time_s, "ar_decode_time_s": ref.stats.decode_time_s,
                                   "ar_new_tokens": ref.stats.new_tokens})
                parts[name].append(ours.stats)
    return rows, {name: DecodeStats.merge(p) for name, p in parts.items()}, ref_rows, DecodeStats.merge(ref_parts)


def metric_score(task: TaskSpec, metric: str, examples: list[Example], texts: list[str | None]) -> float | None:
    """One metric of `task` for `texts` (aligned with `examples`), e.g. the main metric of another output."""
    rows = [{"text": t or "", "token_ids": []} for t in texts]
    return task_quality(replace(task, metrics=(metric,)), examples, rows).get(metric)


def task_quality(task: TaskSpec, examples: list[Example], rows: list[dict]) -> dict:
    """The task's quality metrics for decoded `rows` (aligned with `examples`).

    `agreement` is position-wise agreement with the target's greedy output (`ar_token_ids`, else the
    row's own tokens for `ar` itself); `nll` is the target's mean negative log-likelihood of the output
    (nats/token), pooled over the rows' `target_nll` that the decode scored with the target;
    `pass_at_1` runs the HumanEval tests in a sandboxed process; `compiles` and `doctest_pass` check
    generated function bodies (`viasd.metrics.code_checks`); the rest are text metrics from
    `viasd.metrics`. Examples that carry a `def_indent` (function bodies) are scored on the body the
    output holds, cut where its indentation returns to the `def`'s.
    """
    from ..metrics.code_checks import body_compiles, generated_body, passes_doctests
    from ..metrics.execution import pass_at_1
    from ..metrics.model_metrics import agreement
    from ..metrics.text_metrics import compute

    texts = [generated_body(row["text"] or "", e.extra["def_indent"]) if "def_indent" in e.extra else row["text"] or ""
             for e, row in zip(examples, rows)]
    out: dict = {}
    for name in task.metrics:
        if name == "agreement":
            scores = [agreement(r["token_ids"], r.get("ar_token_ids", r["token_ids"])) for r in rows]
            out["agreement"] = sum(scores) / max(len(scores), 1)
        elif name == "nll":
            scored = [(r["target_nll"], len(r["token_ids"])) for r in rows if r.get("target_nll") is not None]
            if scored:
                out["nll"] = sum(v * n for v, n in scored) / sum(n for _, n in scored)
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


# metrics that are a mean over examples of one value each that runs code (a test, a compile): their drop's standard
# error is computed from each example's value, once, not by re-scoring subsets (which would run the code again)
PER_EXAMPLE_METRICS = frozenset({"pass_at_1", "compiles", "doctest_pass"})


def task_drop_standard_error(task: TaskSpec, metric: str, examples: list[Example], ar_texts: list[str | None],
                             texts: list[str | None], groups: list | None = None, max_blocks: int = 50) -> float | None:
    """The standard error of the task drop `points(score(ar_texts)) - points(score(texts))` (`metrics.quality.task_drop`,
    the same prompts), by the delete-one-group jackknife: with the drop D_(g) recomputed without group g's examples,
    K groups and D_bar their mean, SE^2 = (K - 1) / K * sum_g (D_(g) - D_bar)^2.

    Why the jackknife: a corpus metric (chrF, BLEU) is not a mean over examples, so the spread of per-example
    differences does not give its error; the jackknife recomputes the statistic itself and is paired (both
    outputs lose the same examples), and `groups` (source files) make it cluster-robust as the fidelity's SE is
    (`metrics.model_metrics.fidelity_standard_error`). More than `max_blocks` groups are dealt round-robin into that
    many blocks (the grouped jackknife), which bounds the cost at 2 x `max_blocks` scorings. Metrics of
    `PER_EXAMPLE_METRICS` are scored per example once and the means recomputed. None with fewer than two groups.

    Shapes: `examples`, `ar_texts`, `texts`, `groups` aligned, one entry per example."""
    from ..metrics.quality import points

    n = len(examples)
    if not (len(ar_texts) == len(texts) == n) or (groups is not None and len(groups) != n):
        raise ValueError(f"{n} examples, {len(ar_texts)} ar texts, {len(texts)} texts, "
                         f"{len(groups) if groups is not None else n} groups")
    groups = list(range(n)) if groups is None else groups
    names = list(dict.fromkeys(groups))
    block = {g: i % max_blocks for i, g in enumerate(names)}
    blocks = sorted(set(block.values()))
    if len(blocks) < 2:
        return None
    if metric in PER_EXAMPLE_METRICS:
        ours = [metric_score(task, metric, [e], [t]) for e, t in zip(examples, texts)]
        theirs = [metric_score(task, metric, [e], [t]) for e, t in zip(examples, ar_texts)]

        def drop(keep: list[int]) -> float | None:
            pairs = [(theirs[i], ours[i]) for i in keep if theirs[i] is not None and ours[i] is not None]
            if not pairs:
                return None
            return points(metric, sum(a - b for a, b in pairs) / len(pairs))
    else:
        def drop(keep: list[int]) -> float | None:
            a = metric_score(task, metric, [examples[i] for i in keep], [ar_texts[i] for i in keep])
            b = metric_score(task, metric, [examples[i] for i in keep], [texts[i] for i in keep])
            return None if a is None or b is None else points(metric, a) - points(metric, b)

    left_out = [drop([i for i in range(n) if block[groups[i]] != b]) for b in blocks]
    left_out = [d for d in left_out if d is not None]
    k = len(left_out)
    if k < 2:
        return None
    mean = sum(left_out) / k
    return ((k - 1) / k * sum((d - mean) ** 2 for d in left_out)) ** 0.5
