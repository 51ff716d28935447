"""The dev split a threshold search measures policies on (`DevSet`): the prompts, the target's greedy
outputs and task score computed once (`SharedDev`, shared by every slim's search of one pair and task),
the cost model's per-pass costs, and one policy's decode of every prompt with its cost and quality."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

from ..decoding.policy import DecodePolicy
from ..decoding.stats import DecodeStats
from ..errors import ViasdError
from ..metrics.model_metrics import agreement, fidelity_standard_error, pooled
from ..metrics.quality import main_metric, task_drop
from ..models import ModelSet
from ..tasks.base import Example, TaskSpec
from .pass_cost import (
    PassCost,
    cost_per_token,
    decode_seconds,
    fit_pass_costs,
    full_layout,
    missing_layouts,
    widths_per_token,
)

log = logging.getLogger(__name__)

OFF = math.inf  # a tier threshold no score reaches: the tier is off


@dataclass
class SharedDev:
    """What every slim's search of one pair, task and engine has in common, computed by the first and
    reused by the others: the target's greedy dev outputs with their task score and time, and the
    tiers-off (SD) points, which never run a slim (each search costs their pass counts with its own per-pass costs);
    `ar_texts`, the greedy outputs' texts, pair each trial's task drop for its standard error."""

    reference: list[list[int]]
    ar_task: float | None
    ar_seconds_per_token: float
    tiers_off: list[dict] | None = None
    ar_texts: list[str] | None = None


class DevSet:
    """Dev prompts with the target's greedy outputs and their task score, computed once, and the cost
    model's per-pass costs.

    `batch_size` > 1: a policy's dev decodes run in batches (`decoding.batching`): each row decodes to the tokens and
    passes it decodes alone, so quality and the cost model are as at batch 1, in a fraction of the time; only a
    batched row's wall time is the batch's, so the first `wall_prompts` prompts are decoded one at a time and give
    the wall times the cost model is calibrated on (`search.wall_factors`) and the wall-ranked baselines are ranked
    by (`timed_prompts` of a point).

    `pass_cost` is keyed by runner *layout*, `name:layers` (`DecodeStats.layouts`): a full-model pass (`target:12`)
    costs more than the full model's rest after a shared trunk (`target:11` beside `trunk:1`, reuse),
    so tiers-off (SD) blocks and tiered blocks are each costed as they run, and each layout's cost is a
    function of the pass's width (`PassCost`). Costs measured elsewhere are used as given when they
    cover this slim's layouts: searches for several slim verifiers of the same layout then differ by
    their pass counts, not by timing noise. Otherwise (or without them) `measure_pass_cost` fits them
    here (once, on first need)."""

    def __init__(self, models: ModelSet, examples: list[Example], max_new_tokens: int, stop_strings=(),
                 pass_cost: dict[str, PassCost] | None = None, task: TaskSpec | None = None, engine: dict | None = None,
                 shared: SharedDev | None = None, base: DecodePolicy | None = None, batch_size: int = 1,
                 wall_prompts: int = 8):
        self.models = models
        self.batch_size = batch_size
        self.wall_prompts = wall_prompts
        self.examples = examples
        self.task = task
        self.metric = main_metric(task.metrics) if task is not None else None
        self.prompts = [e.prompt_ids if e.prompt_ids is not None else models.encode(e.prompt) for e in examples]
        # the policy every trial varies: `base` (the study's, from its grid-cell layer), else viasd with these
        # settings; engine: cache, compile, reuse (as the decode stage runs)
        self.base = base or DecodePolicy(method="viasd", max_new_tokens=max_new_tokens, stop_strings=tuple(stop_strings),
                                         **(engine or {}))
        if shared is None:
            ar = [r for _, chunk in self._decode_chunks(replace(self.base, method="ar")) for r in chunk]
            ar_stats = DecodeStats.merge([r.stats for r in ar[: self.timed]])
            shared = SharedDev([r.token_ids for r in ar], self.task_score([r.text for r in ar]),
                               ar_stats.wall_time_s / max(ar_stats.new_tokens, 1), ar_texts=[r.text for r in ar])
        self.shared = shared
        self.reference, self.ar_task = shared.reference, shared.ar_task
        self.ar_seconds_per_token = shared.ar_seconds_per_token
        self.pass_cost = dict(pass_cost) if pass_cost is not None else None
        self.layouts = {key for probe in self._probes(4)
                        for key in self.models.generate(self.prompts[0], probe).stats.layouts().values()}
        if self.pass_cost is not None and not self.layouts <= set(self.pass_cost):
            log.info("the shared per-pass costs cover %s, this slim runs %s: measuring its own", sorted(self.pass_cost),
                     sorted(self.layouts))
            self.pass_cost = None

    @property
    def timed(self) -> int:
        """How many of the first prompts are decoded one at a time, their wall times measured."""
        return len(self.prompts) if self.batch_size <= 1 else min(self.wall_prompts, len(self.prompts))

    def _decode_chunks(self, policy: DecodePolicy, references: list | None = None):
        """The prompts' decodes in order, as (first index, results) chunks: the first `timed` one at a time, the rest
        `batch_size` at a time (`references`: each prompt's oracle reference)."""
        n = len(self.prompts)
        starts = [*range(self.timed), *range(self.timed, n, max(self.batch_size, 1))]
        for k, lo in enumerate(starts):
            hi = starts[k + 1] if k + 1 < len(starts) else n
            refs = references[lo:hi] if references is not None else None
            if hi - lo == 1:
                yield lo, [self.models.generate(self.prompts[lo], policy, oracle_reference=refs[0] if refs else None)]
            else:
                yield lo, self.models.generate_batch(self.prompts[lo:hi], policy, oracle_references=refs)[0]

    def _probes(self, max_new_tokens: int | None = None) -> list[DecodePolicy]:
        """Decodes that exercise every runner layout: tiers that never pass (the slim runs every block and
        every block escalates), and tiers off (plain SD: full-model passes, no slim)."""
        never = replace(self.base, gamma=4, tau_accept=1e30, tau_slim=2.0, score="ratio", confidence="max_prob",
                        verify_lagged=False, gate=0.0, max_lag=0, max_new_tokens=max_new_tokens or self.base.max_new_tokens)
        return [never, replace(never, tau_accept=OFF, tau_slim=OFF)]

    def task_score(self, texts: list[str | None]) -> float | None:
        """The task's main metric of `texts` against the dev references (None without a task metric)."""
        if self.metric is None or self.models.tokenizer is None:
            return None
        from ..evaluation.side_by_side import metric_score

        return metric_score(self.task, self.metric, self.examples, texts)

    def task_drop_se(self, texts: list[str | None], groups: list | None) -> float | None:
        """The standard error of the task drop of `texts` (the first len(texts) dev prompts' outputs) against the
        target's greedy outputs, clustered by `groups` (`evaluation.task_drop_standard_error`)."""
        if self.metric is None or self.models.tokenizer is None or self.shared.ar_texts is None:
            return None
        from ..evaluation.side_by_side import task_drop_standard_error

        n = len(texts)
        return task_drop_standard_error(self.task, self.metric, self.examples[:n], self.shared.ar_texts[:n], texts, groups)

    def measure_pass_cost(self, gammas=(2, 3, 4, 6)) -> dict[str, PassCost]:
        """Each runner layout's `PassCost`, fitted on the decoding passes of the probe decodes of the first
        two prompts at every gamma of `gammas` (so every block width a searched policy runs is measured),
        after one warm-up decode that is not counted (first calls allocate and pick kernels)."""
        probes = self._probes()
        self.models.generate(self.prompts[0], probes[0])
        runs = [self.models.generate(p, replace(probe, gamma=g)).stats
                for g in gammas for probe in probes for p in self.prompts[:2]]
        self.pass_cost = fit_pass_costs(runs)
        return self.pass_cost

    def evaluate(self, policy: DecodePolicy, min_fidelity: float | None = None, modelled: bool = True) -> dict:
        """Decode every dev prompt with `policy`: cost (model and wall) and the three quality measures.
        `modelled=False`: the wall times alone (`cost_per_token` None), for a method whose passes the cost model
        has not priced.

        With `min_fidelity`, stop as soon as the policy cannot reach it whatever the remaining prompts
        give: after prompts 1..k with m of n tokens equal to the target's greedy choice, the best the
        rest can do is R = (remaining prompts) x max_new_tokens more tokens, all equal, so the final
        fidelity is at most (m + R) / (n + R). Below `min_fidelity` the point is infeasible, and its
        measures (`pruned`: true, `prompts`: k) are those of the first k prompts, with no task score.
        """
        results, row_scores = [], []
        matched = total = 0.0
        oracle = policy.router == "oracle"  # the target's greedy dev outputs spare the oracle its peek passes
        for lo, chunk in self._decode_chunks(policy, self.reference if oracle else None):
            for i, result in enumerate(chunk, lo):
                _, (score,) = self.models.score([self.prompts[i]], [result.token_ids], policy)
                results.append(result)
                row_scores.append(score)
                if score:
                    matched, total = matched + score["fidelity"] * score["tokens"], total + score["tokens"]
            rest = (len(self.prompts) - len(results)) * policy.max_new_tokens
            if min_fidelity is not None and rest and (matched + rest) / (total + rest) < min_fidelity:
                break
        pruned = len(results) < len(self.prompts)
        stats = DecodeStats.merge([r.stats for r in results])
        tokens = max(stats.new_tokens, 1)
        # wall times of the prompts decoded one at a time (all of them at batch 1)
        timed = DecodeStats.merge([r.stats for r in results[: self.timed]])
        timed_tokens = max(timed.new_tokens, 1)
        agree = sum(agreement(r.token_ids, ref) for r, ref in zip(results, self.reference)) / len(results)
        scores = pooled(row_scores)
        # prompts of one group (cuts of one source file) are not independent: the SE clusters by group
        groups = [self.task.group(e) for e in self.examples[: len(results)]] if self.task is not None else None
        texts = [r.text for r in results]
        score = None if pruned else self.task_score(texts)
        keys = stats.layouts()
        missing = missing_layouts(stats, self.pass_cost) if modelled else None
        if missing:
            raise ViasdError(f"no measured per-pass cost for runner layout(s) {sorted(missing)} (have {sorted(self.pass_cost)})")
        widths = widths_per_token(stats)
        modeled = cost_per_token(widths, self.pass_cost) if modelled else None
        # the modelled cost of the prompts whose wall time was measured: what the calibration divides by
        timed_widths = widths if len(results) <= self.timed else widths_per_token(timed)
        timed_modeled = cost_per_token(timed_widths, self.pass_cost) if modelled else None
        # wall time per token, and without the prefill as the model prices it (`search.wall_calibration`)
        return {"cost_per_token": modeled, "wall_per_token": timed.wall_time_s / timed_tokens,
                "decode_wall_per_token": decode_seconds(timed) / timed_tokens,
                "timed_prompts": min(len(results), self.timed), "timed_cost_per_token": timed_modeled,
                "timed_pass_widths_per_token": timed_widths,
                "fidelity": scores["fidelity"], "fidelity_se": fidelity_standard_error(row_scores, groups),
                "groups": len(set(groups)) if groups is not None else len(results),
                "nll": scores["nll"], "agreement": agree,
                "task_metric": self.metric, "task_score": score, "task_score_ar": self.ar_task,
                "task_drop": task_drop(self.metric, self.ar_task, score) if self.metric and not pruned else None,
                "task_drop_se": None if pruned else self.task_drop_se(texts, groups),
                "pruned": pruned, "prompts": len(results),
                "rejection_rate": stats.rejection_rate, "acceptance_rate": stats.acceptance_rate,
                "block_escalation_rate": stats.block_escalation_rate, "gated_rate": stats.gated_rate,
                "full_passes_per_token": stats.full_passes_per_token(),
                "position_pass_rates": stats.position_pass_rates(),
                "lagged_rolled_back": stats.lagged_rolled_back,
                "position_escalation_rate": stats.position_escalation_rate, "slim_error_rate": stats.slim_error_rate,
                "passes_per_token": {k: stats.passes[m] / tokens for m, k in keys.items()},
                "pass_widths_per_token": widths,
                "speedup_model_vs_ar": (self.full_pass_cost() / modeled) if modeled else None}

    def full_pass_cost(self) -> float:
        """Seconds of one unshared one-token full-model pass (the ar step the cost model compares with)."""
        return self.pass_cost[full_layout(self.pass_cost)](1)
