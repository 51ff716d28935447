"""What `viasd bench` checks and scores in its methods' outputs, before any timing.

- `check_outputs`: every lossless method must make the reference's tokens. Reduced precision: in
  bfloat16 distinct logits often round to one value, and which tied token greedy picks depends on
  kernel shapes, so a lossless method may part from the reference at such a tie; exactly those are
  accepted (logit gap within the measured rounding noise, `tie_gap`) and listed; anything else raises.
- `quality_of`: fidelity, the target's NLL and the task metric of every method's outputs.

Pure library code: models and token lists in, JSON-ready dicts out.
"""

from __future__ import annotations

import logging

import torch

from ..errors import BenchError
from ..models import ModelSet

log = logging.getLogger(__name__)

MUST_MATCH = ("ar", "sd", "self_sd", "cascade_sd", "sd-drafter_feature", "sd-drafter_self", "hf_ar", "hf_assisted",
              "hf_assisted_fixed", "hf_assisted_heuristic", "hf_early_exit")


def quality_of(models: ModelSet, prompts: list[list[int]], tokens: dict[str, list[list[int]]],
               references: list[str] | None = None, metric: str | None = None, policy=None) -> dict[str, dict]:
    """Per method: `fidelity` and `nll` of its outputs under the target (one teacher-forced pass per
    output; as `policy` processes it, with its generation settings) and, with `references` and `metric`,
    the task metric of its texts and `task_drop` in points against the reference method's (`ar`, else
    `hf_ar`) with its standard error (`task_drop_se`, `evaluation.task_drop_standard_error`): the quality beside
    every speed figure. `outputs_differing`: how many of the prompts' outputs differ from the reference method's
    at all (the only prompts a drop can come from; a lossy token changes the rest of a greedy output, so this
    share, not the fidelity, sets how noisy the drop is)."""
    from ..decoding.policy import DecodePolicy
    from ..evaluation.side_by_side import metric_score, task_drop_standard_error
    from ..metrics.quality import task_drop
    from ..tasks.base import Example, TaskSpec

    scored = references is not None and metric is not None and models.tokenizer is not None
    examples = [Example(id=str(i), prompt="", reference=r) for i, r in enumerate(references or [])]
    out: dict[str, dict] = {}
    for name, outs in tokens.items():
        scores, _ = models.score(prompts, outs, policy or DecodePolicy(generation_config=False))
        out[name] = {"fidelity": scores["fidelity"], "nll": scores["nll"]}
        if scored:
            texts = [models.tokenizer.decode(o, skip_special_tokens=True) for o in outs]
            out[name]["task_metric"] = metric
            out[name]["task_score"] = metric_score(TaskSpec("bench", (metric,)), metric, examples, texts)
            out[name]["texts"] = texts
    base = next((n for n in ("ar", "hf_ar") if n in out), None)
    for name, row in (out.items() if base is not None else ()):
        # the prompts a task drop can come from: an output equal to the base's scores the same
        row["outputs_differing"] = sum(a != b for a, b in zip(tokens[name], tokens[base]))
        if "task_score" in row:
            row["task_drop"] = task_drop(metric, out[base]["task_score"], row["task_score"])
            # paired, each prompt its own unit (the bench's prompts are cut from different files)
            row["task_drop_se"] = None if name == base else task_drop_standard_error(
                TaskSpec("bench", (metric,)), metric, examples, out[base]["texts"], row["texts"])
    for row in out.values():
        row.pop("texts", None)
    return out


def check_outputs(models: ModelSet, prompts: list[list[int]], tokens: dict[str, list[list[int]]],
                  reference: str | None = None) -> list[dict]:
    """Every lossless method must make the reference's (`reference`, else `hf_ar`, else `ar`) tokens on every prompt.

    A divergence is allowed only where it is a numerical tie of the target: at the first differing
    position, the target's logits of the two tokens (one parallel forward over the shared prefix) are
    within twice the rounding noise of its dtype, measured there as the largest difference between a
    parallel and a token-by-token cached forward over the last positions (`tie_gap`). In float32
    the noise is a few 1e-6 and a tie practically never happens; in bfloat16 distinct logits often round to
    the same value, and which of the tied tokens wins depends on the kernel shapes, so batched
    verification (sd) and single steps (ar) legitimately part there. Returns the ties (method, prompt,
    position, logit gap, noise); anything else raises `BenchError`.
    """
    reference = reference or next((n for n in ("hf_ar", "ar") if n in tokens), None)
    ties: list[dict] = []
    for name in (n for n in MUST_MATCH if n in tokens and reference not in (None, n)):
        for i, (ours, ref) in enumerate(zip(tokens[name], tokens[reference])):
            if ours == ref:
                continue
            first = next((k for k, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
            detail = ""
            if first is not None:  # else one is a prefix of the other (run_benchmark checks lengths first)
                gap, noise = tie_gap(models.target, prompts[i] + ref[:first], ref[first], ours[first])
                if gap <= 2 * noise:
                    ties.append({"method": name, "reference": reference, "prompt": i, "position": first,
                                 "logit_gap": gap, "noise": noise})
                    log.warning("%s and %s part at a numerical tie on prompt %d, position %d (logit gap %.3g, "
                                "noise %.3g)", name, reference, i, first, gap, noise)
                    continue
                detail = f"; the target's logits differ by {gap:.3g} there, noise {noise:.3g}"
            at = first if first is not None else min(len(ours), len(ref))
            raise BenchError(f"{name} and {reference} produced different tokens on prompt {i} (first at "
                             f"position {at}{detail}); refusing to report a speedup")
    return ties


@torch.inference_mode()
def tie_gap(model: torch.nn.Module, ids: list[int], a: int, b: int, k: int = 8) -> tuple[float, float]:
    """`|z_a - z_b|`, the target's next-token logits of tokens `a` and `b` after `ids`, and its rounding
    noise there: the largest `|z_parallel - z_stepped|` over the last `k` positions and the vocabulary,
    where `z_parallel` comes from one forward over `ids` and `z_stepped` from feeding its last `k` tokens
    one at a time through a KV cache (the engine's `ModelRunner`). Both are zero in exact arithmetic;
    the noise is what the dtype's rounding leaves. The gap is read off the parallel forward's last row.
    """
    from ..decoding.kv_cache import model_cache
    from ..decoding.runner import ModelRunner

    x = torch.tensor([ids], device=next(model.parameters()).device)  # [1, T]
    length = x.shape[1]
    k = max(1, min(k, length - 1))
    parallel = model(input_ids=x, logits_to_keep=k).logits[0, -k:].float()  # [k, V]
    stepped = ModelRunner("tie", model, lambda: model_cache(model, "inplace", length), parallel.shape[-1], False)
    stepped.start()
    stepped.forward(x, length - k, 1)  # the prefix, in parallel
    rows = torch.cat([stepped.forward(x, t + 1, 1) for t in range(length - k, length)])  # [k, V]
    z = parallel[-1]
    return abs(z[a].item() - z[b].item()), (parallel - rows).abs().max().item()
