"""Speed against batch size: throughput and latency of `hf_ar`, `ar`, `sd`, `viasd` at batch 1, 2, 4, ...

Speculative decoding saves full-model passes by spending cheaper ones; at batch 1 on most hardware a pass
costs about the same whatever its width, so the saving is nearly all gain. As the batch grows, a full pass
over B rows costs more than one over a single row, SD's extra draft passes and rejected columns start to
count, and its gain over `ar` shrinks. The question here is whether VIA-SD's middle tier, which saves whole
full-model passes, keeps its gain over SD as the batch grows.

For each batch size `b`, every method decodes the same prompts, at most `b` at a time (a finished row's slot
takes the next prompt: `decoding.batching`); `hf_ar` is transformers' batched greedy `generate` with left
padding, over chunks of `b` prompts. Batch 1 is today's decode, one prompt at a time. No stop rule: every
prompt makes exactly `max_new_tokens` tokens, so throughputs compare like with like.

Before timing, round 0 decodes every prompt with every method at every batch size: the lossless methods must
make `ar`'s batch-1 tokens at every batch size (`outputs.check_outputs`: a numerical tie of the target — left
padding and wider passes change the kernels' rounding — is listed, anything else raises), and every method's
quality (fidelity, task metric) is scored on its outputs. Then `repeats` rounds, each running every (batch size,
method) once over all prompts in a rotated order; a round's throughput is its tokens over its wall time. Ratios
per batch size are geometric means over rounds of the paired per-round ratios, with 95 % intervals that treat
rounds as the independent units (`metrics.speed.paired_ratio`).

Pure library code: models and prompts in, a JSON-ready dict out.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from ..decoding.policy import DecodePolicy
from ..errors import BenchError
from ..metrics.speed import describe, paired_ratio
from ..models import ModelSet
from .methods import BenchMethod
from .outputs import MUST_MATCH, check_outputs, quality_of
from .timing import generation_settings

log = logging.getLogger(__name__)

BATCH_METHODS = ["hf_ar", "ar", "sd", "viasd"]
# the ratios reported per batch size: (name, ours, base)
BATCH_RATIOS = (("ar_vs_hf_ar", "ar", "hf_ar"), ("sd_vs_ar", "sd", "ar"), ("viasd_vs_sd", "viasd", "sd"),
                ("viasd_vs_ar", "viasd", "ar"))


def hf_batch_generate(models: ModelSet, max_new_tokens: int, settings) -> Callable:
    """`(prompts, b) -> outputs`: transformers' greedy `generate` over chunks of `b` prompts, left-padded with an
    attention mask (its batched path), no EOS stop, with the per-token generation `settings` ours decode with."""
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=max_new_tokens, min_new_tokens=0, do_sample=False, eos_token_id=None,
                              pad_token_id=0, use_cache=True, **settings.as_dict())
    device = next(models.target.parameters()).device

    @torch.inference_mode()
    def run(prompts: list[list[int]], b: int) -> BatchRun:
        outs, latencies = [], []
        for start in range(0, len(prompts), b):
            chunk = prompts[start : start + b]
            width = max(len(p) for p in chunk)
            ids = torch.zeros((len(chunk), width), dtype=torch.long, device=device)
            mask = torch.zeros_like(ids)
            for i, p in enumerate(chunk):
                ids[i, width - len(p) :] = torch.tensor(p, device=device)
                mask[i, width - len(p) :] = 1
            began = time.perf_counter()
            out = models.target.generate(ids, attention_mask=mask, generation_config=config)
            latencies += [time.perf_counter() - began] * len(chunk)
            outs += [row[width:].tolist() for row in out]
        return BatchRun(outs, latencies)

    return run


class BatchRun(NamedTuple):
    """One method's decode of the prompts at one batch size: outputs and per-request latencies; ours also each
    prompt's statistics and the model passes run (batched passes; batch 1: every prompt's, prefill included)."""

    tokens: list[list[int]]
    latencies: list[float]
    stats: list | None = None
    passes: dict[str, int] | None = None


def _ours(models: ModelSet, method: BenchMethod) -> Callable:
    """`(prompts, b) -> BatchRun` of one of our methods; batch 1 is the plain decode, one prompt at a time."""

    def run(prompts: list[list[int]], b: int):
        if b == 1:
            results = [models.generate(p, method.policy) for p in prompts]
            passes: dict[str, int] = {}
            for r in results:
                for name, n in r.stats.passes.items():
                    prefill = sum(v for k, v in r.stats.pass_widths.items()
                                  if k.startswith(f"{name}:") and k.endswith("/prefill"))
                    passes[name] = passes.get(name, 0) + n + prefill
        else:
            results, batch = models.generate_batch(prompts, method.policy, batch_size=b)
            passes = dict(batch.passes)
        return BatchRun([r.token_ids for r in results], [r.stats.wall_time_s for r in results],
                        [r.stats for r in results], passes)

    return run


def run_batch_benchmark(models: ModelSet, prompts: list[list[int]], methods: list[BenchMethod], batch_sizes: list[int],
                        max_new_tokens: int, repeats: int = 3, progress: bool = True,
                        references: list[str] | None = None, metric: str | None = None) -> dict:
    """Check outputs at every batch size, then time every (batch size, method) over `repeats` rounds; returns
    per batch size each method's tokens/s (median over rounds), latency per request, target passes per token,
    the ratios of `BATCH_RATIOS` with intervals, and `ar`'s throughput over its batch-1 throughput."""
    from tqdm.auto import tqdm

    if not batch_sizes or min(batch_sizes) < 1:
        raise BenchError(f"--batch takes batch sizes of at least 1, got {batch_sizes}")
    if repeats < 1:
        raise BenchError(f"repeats must be at least 1, got {repeats}")
    settings = generation_settings(models, methods)
    runs = {m.name: _ours(models, m) if m.policy is not None else hf_batch_generate(models, max_new_tokens, settings)
            for m in methods}
    names = [m.name for m in methods]
    n_tokens = len(prompts) * max_new_tokens
    # round 0: outputs at every batch size, their checks and quality
    tokens: dict[int, dict[str, list[list[int]]]] = {}
    passes: dict[int, dict[str, float | None]] = {}
    model_passes: dict[int, dict[str, dict | None]] = {}
    for b in tqdm(batch_sizes, desc="bench --batch: check outputs", disable=not progress, leave=False):
        tokens[b], passes[b], model_passes[b] = {}, {}, {}
        for name in names:
            out = runs[name](prompts, b)
            tokens[b][name] = out.tokens
            passes[b][name] = sum(s.passes.get("target", 0) for s in out.stats) / n_tokens if out.stats else None
            model_passes[b][name] = out.passes
    # the reference: the target's greedy tokens, one prompt at a time (`ar`'s plain decode)
    base = next((m for m in methods if m.name == "ar"), None) or BenchMethod(
        "ar", DecodePolicy(method="ar", max_new_tokens=max_new_tokens, eos_token_ids=()))
    reference = tokens[1]["ar"] if 1 in tokens and "ar" in tokens[1] else _ours(models, base)(prompts, 1).tokens
    # every lossless method at every batch size against the reference; a numerical tie of the target is listed
    ties = []
    for b in batch_sizes:
        outs = {"reference": reference, **{n: t for n, t in tokens[b].items() if n in MUST_MATCH}}
        ties += [{**tie, "batch": b} for tie in check_outputs(models, prompts, outs, reference="reference")]
    quality = quality_of(models, prompts, tokens[max(batch_sizes)], references, metric)
    # timed rounds: every (batch size, method) once per round, the order rotated from round to round
    cells = [(b, name) for b in batch_sizes for name in names]
    rates: dict[tuple, list[float]] = {c: [] for c in cells}
    latency: dict[tuple, list[float]] = {c: [] for c in cells}
    with tqdm(total=repeats * len(cells), desc="bench --batch: timed rounds", disable=not progress, leave=False) as bar:
        for r in range(repeats):
            shift = r % len(cells)
            for b, name in cells[shift:] + cells[:shift]:
                start = time.perf_counter()
                out = runs[name](prompts, b)
                seconds = time.perf_counter() - start
                rates[b, name].append(n_tokens / seconds)
                latency[b, name].append(statistics.mean(out.latencies))
                bar.update()
    table = []
    for b in batch_sizes:
        row = {"batch": b, "methods": {}, "ratios": {}}
        for name in names:
            row["methods"][name] = {"tokens_per_second": statistics.median(rates[b, name]),
                                    "rounds": rates[b, name],
                                    "latency_s": statistics.median(latency[b, name]),
                                    "target_passes_per_token": passes[b][name],
                                    "model_passes": model_passes[b][name]}
        for key, ours, base in BATCH_RATIOS:
            if ours in names and base in names:
                row["ratios"][key] = paired_ratio([1 / x for x in rates[b, base]], [1 / x for x in rates[b, ours]])
        if "ar" in names:
            row["ar_vs_ar_batch_1"] = (row["methods"]["ar"]["tokens_per_second"]
                                       / statistics.median(rates[batch_sizes[0], "ar"])) if batch_sizes[0] == 1 else None
        table.append(row)
    return {"batch_sizes": batch_sizes, "methods": names, "rows": table, "repeats": repeats,
            "prompts": len(prompts), "max_new_tokens": max_new_tokens, "numerical_ties": ties,
            "quality": {k: {q: v.get(q) for q in ("fidelity", "nll", "task_metric", "task_score", "task_drop",
                                                    "task_drop_se", "outputs_differing")} for k, v in quality.items()},
            "policies": {m.name: _policy_summary(m) for m in methods}}


def _policy_summary(method: BenchMethod) -> dict | None:
    p = method.policy
    if p is None:
        return None
    out = {"method": p.method, "gamma": p.gamma}
    if p.method == "viasd":
        out.update(router=p.router, tau_accept=p.tau_accept, tau_slim=p.tau_slim, gate=p.gate)
    return out


def batch_markdown(result: dict, title: str) -> str:
    """The batch table: tokens/s and latency per method, the ratios with intervals, quality beside them."""
    names = result["methods"]
    lines = [f"# {title}\n", "| batch | " + " | ".join(f"{n} tok/s (latency s)" for n in names)
             + " | ar vs batch 1 | " + " | ".join(k for k, _, _ in BATCH_RATIOS) + " |",
             "|---|" + "---|" * (len(names) + 1 + len(BATCH_RATIOS))]
    for row in result["rows"]:
        cells = [f"{row['methods'][n]['tokens_per_second']:.1f} ({row['methods'][n]['latency_s']:.2f})" for n in names]
        scale = row.get("ar_vs_ar_batch_1")
        cells.append("–" if scale is None else f"{scale:.2f}×")
        cells += [describe(row["ratios"].get(k)) for k, _, _ in BATCH_RATIOS]
        lines.append(f"| {row['batch']} | " + " | ".join(cells) + " |")
    lines += ["", "Model passes run (batched passes: a pass over several rows counts once; batch 1: every prompt's, "
              "prefill included):", "", "| batch | " + " | ".join(n for n in names if n != "hf_ar") + " |",
              "|---|" + "---|" * len([n for n in names if n != "hf_ar"])]
    for row in result["rows"]:
        cells = [" · ".join(f"{k} {v}" for k, v in (row["methods"][n].get("model_passes") or {}).items()) or "–"
                 for n in names if n != "hf_ar"]
        lines.append(f"| {row['batch']} | " + " | ".join(cells) + " |")
    lines += ["", "Quality of each method's outputs (the same at every batch size: each row decodes as its prompt "
              "alone):", "", "| method | fidelity | NLL | task metric | drop vs ar (points) |", "|---|---|---|---|---|"]

    def f(x, d=3):
        return "–" if x is None else f"{x:.{d}f}"

    for name, q in result["quality"].items():
        drop = f(q.get("task_drop"), 2) + ("" if q.get("task_drop_se") is None else f" (SE {q['task_drop_se']:.2f})")
        lines.append(f"| {name} | {f(q.get('fidelity'))} | {f(q.get('nll'))} | {f(q.get('task_score'), 2)} | {drop} |")
    lines += ["", "Intervals: 95 %, rounds as the independent units; latency: median over rounds of the mean "
              "seconds from a request's first pass to its last token."]
    return "\n".join(lines) + "\n"


def batch_plot(result: dict, path) -> None:
    """Throughput against batch size per method, and the ratios with their intervals."""
    from ..io import pyplot, save_figure

    plt = pyplot()
    fig, (speed, ratio) = plt.subplots(1, 2, figsize=(11, 4))
    xs = [row["batch"] for row in result["rows"]]
    for name in result["methods"]:
        speed.plot(xs, [row["methods"][name]["tokens_per_second"] for row in result["rows"]], marker="o", label=name)
    for key, _, _ in BATCH_RATIOS:
        points = [(row["batch"], row["ratios"].get(key)) for row in result["rows"] if row["ratios"].get(key)]
        if not points:
            continue
        ys = [r["ratio"] for _, r in points]
        low = [r["ratio"] - (r["low"] if r["low"] is not None else r["ratio"]) for _, r in points]
        high = [(r["high"] if r["high"] is not None else r["ratio"]) - r["ratio"] for _, r in points]
        ratio.errorbar([b for b, _ in points], ys, yerr=[low, high], marker="o", capsize=3, label=key)
    ratio.axhline(1.0, color="grey", lw=0.8)
    for ax, label in ((speed, "tokens/s (median over rounds)"), (ratio, "speed ratio (95 % interval)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("batch size (prompts decoded together)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(result.get("title", "speed against batch size"), fontsize=10)
    save_figure(fig, path)
    plt.close(fig)
