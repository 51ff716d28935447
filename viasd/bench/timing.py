"""Side-by-side speed benchmark: our methods against `transformers` generate and assisted generation.

One process, one model load, the same prompts; greedy, batch 1, no stop rule (every method makes
exactly `max_new_tokens` tokens, so tokens/s compare like with like). Before any timing, the
lossless methods and `hf_ar` must produce the same tokens on every prompt, else `BenchError`.
Then `repeats` rounds run every method over all prompts, after a warm-up round, interleaved by prompt
(every method decodes a prompt before any decodes the next, in the balanced orders of a Williams design);
a method's tokens/s per round is its tokens over its wall time on the round's prompts.

The checks on the outputs (same tokens for the lossless methods, numerical ties in reduced
precision) and their quality (fidelity, task metric) are in `bench_outputs`.

Which methods there are and what each decodes with: `bench/methods.py`.

What the timed rounds mean (ratios, the cost model's ratios, efficiencies, the oracle's headroom) and
their markdown table are in `bench_figures`.

Pure library code: models and prompts in, a JSON-ready dict out (no files, no tracking).
"""

from __future__ import annotations

import copy
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from ..decoding.processors import ProcessorSettings, resolve
from ..decoding.seq2seq import is_encoder_decoder
from ..decoding.stats import DecodeStats
from ..errors import BenchError
from ..evaluation.run_order import interleaved
from ..models import ModelSet
from .figures import summarise
from .methods import ASSISTED, BenchMethod
from .outputs import check_outputs, quality_of, tie_gap  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)



class PassCounter:
    """Counts forward calls of each named model (forward hooks; works for transformers' own loops)."""

    def __init__(self, modules: dict[str, torch.nn.Module]):
        self.counts = {name: 0 for name in modules}
        self._handles = [m.register_forward_hook(self._hook(name)) for name, m in modules.items() if m is not None]

    def _hook(self, name):
        def hook(module, args, output):
            self.counts[name] += 1

        return hook

    def close(self):
        for h in self._handles:
            h.remove()


class PeakMemory:
    """Peak memory of a block: CUDA's allocator peak, else the process's peak RSS (Linux resets it
    through /proc/self/clear_refs). `mb` is None where neither is available."""

    def __init__(self, device: torch.device):
        self.device = device
        self.mb: float | None = None

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                pass
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            self.mb = torch.cuda.max_memory_allocated(self.device) / 2**20
        else:
            try:
                line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM"))
                self.mb = int(line.split()[1]) / 1024
            except (OSError, StopIteration):
                self.mb = None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _vocab_size(model) -> int:
    return model.config.get_text_config().vocab_size


def hf_generate(models: ModelSet, max_new_tokens: int, assistant: bool, schedule: tuple[int, str, float] | None = None,
                settings: ProcessorSettings | None = None, early_exit: int | None = None) -> Callable:
    """`prompt ids -> new ids` through `transformers`' own generate (greedy, no EOS stop), with the per-token
    generation `settings` our methods decode with, and no other of the target's generation config's
    (`generate` would fill every unset field from it). `assistant`: assisted generation with the draft;
    `early_exit`: self-speculation, the target's first `early_exit` layers drafting (`assistant_early_exit`)."""
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=max_new_tokens, min_new_tokens=0, do_sample=False, eos_token_id=None,
                              pad_token_id=0, use_cache=True, **(settings or ProcessorSettings()).as_dict())
    if assistant and models.cross_vocab and _vocab_size(models.target) == _vocab_size(models.draft):
        raise BenchError("the draft has another tokenizer than the target's but as many tokens, and transformers' "
                         "universal assisted generation tells tokenizers apart by vocabulary size: leave hf_assisted out")
    own_config = models.target.generation_config
    bare = GenerationConfig(**{k: getattr(own_config, k, None) for k in
                               ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")})
    device = next(models.target.parameters()).device
    assistant_config = None
    if assistant and schedule is not None:
        # transformers reads the draft schedule from the *assistant's* generation config: a copy with this
        # many tokens per round, this schedule and this confidence threshold (0: no confidence-based early stop)
        assistant_config = copy.deepcopy(models.draft.generation_config)
        (assistant_config.num_assistant_tokens, assistant_config.num_assistant_tokens_schedule,
         assistant_config.assistant_confidence_threshold) = schedule

    @torch.inference_mode()
    def run(prompt: list[int]) -> list[int]:
        ids = torch.tensor([prompt], device=device)
        kwargs = {"assistant_model": models.draft} if assistant else {}
        if early_exit is not None:
            kwargs["assistant_early_exit"] = early_exit
        if assistant and models.cross_vocab:  # transformers' universal assisted generation
            kwargs.update(tokenizer=models.tokenizer, assistant_tokenizer=models.draft_tokenizer)
        own = models.draft.generation_config if assistant else None
        if assistant_config is not None:
            models.draft.generation_config = assistant_config
        models.target.generation_config = bare
        try:
            out = models.target.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, **kwargs)
        finally:
            models.target.generation_config = own_config
            if own is not None:
                models.draft.generation_config = own
        # a decoder-only model returns prompt + new tokens; an encoder-decoder model the decoder start + new
        return out[0, 1 if is_encoder_decoder(models.target) else len(prompt):].tolist()

    return run




def _runner(models: ModelSet, method: BenchMethod, max_new_tokens: int, settings: ProcessorSettings,
            greedy: dict[tuple, list[int]] | None = None) -> Callable:
    """`prompt -> output` of one method; an oracle's reads its block targets from `greedy` (prompt -> the
    target's greedy output) where it has the prompt, instead of peeking."""
    if method.policy is not None:
        if greedy is not None and method.policy.router == "oracle":
            return lambda prompt: models.generate(prompt, method.policy, oracle_reference=greedy.get(tuple(prompt)))
        return lambda prompt: models.generate(prompt, method.policy)
    return hf_generate(models, max_new_tokens, assistant=method.name in ASSISTED, schedule=method.assistant,
                       settings=settings, early_exit=method.early_exit)


def generation_settings(models: ModelSet, methods: list[BenchMethod]) -> ProcessorSettings:
    """The generation settings our methods decode with (the same in every policy of a benchmark), which
    `transformers`' methods get too."""
    policy = next((m.policy for m in methods if m.policy is not None), None)
    if policy is None:
        return ProcessorSettings.from_generation_config(models.target.generation_config)
    return resolve(models.target, policy.generation_config, policy.generation, policy.sampling.greedy)


def run_benchmark(models: ModelSet, prompts: list[list[int]], methods: list[BenchMethod], max_new_tokens: int,
                  repeats: int = 3, progress: bool = True, references: list[str] | None = None,
                  metric: str | None = None, groups: list | None = None) -> dict:
    """Check outputs, then time every method; returns per-method figures, ratios and efficiencies.

    Every method's row also carries its quality (`quality_of`): fidelity and the target's NLL of its
    outputs, and with `references` and a task `metric`, that metric and its drop against `ar`/`hf_ar`.
    `intervals`: the ratios as geometric means of per-prompt paired ratios (decode seconds per token, averaged
    over the rounds per prompt) with 95 % intervals clustered by `groups` (aligned with `prompts`: their
    source files; None: each prompt its own), `metrics.speed`."""
    from tqdm.auto import tqdm

    device = next(models.target.parameters()).device
    settings = generation_settings(models, methods)
    # the target's greedy output of every prompt, for an oracle among the methods: it reads its block targets
    # there, so its timed rounds run its own passes only (a peek pass between them would slow them). Filled in
    # round 0 before the oracles (checked last): `ar`'s outputs when it runs, else decoded once
    greedy: dict[tuple, list[int]] = {}
    runners = {m.name: _runner(models, m, max_new_tokens, settings, greedy) for m in methods}
    # timed rounds: no per-model synchronisation on a GPU (round 0 measures per-model times)
    timed = {m.name: _runner(models, replace(m, policy=replace(m.policy, exact_timing=False)) if m.policy else m,
                             max_new_tokens, settings, greedy) for m in methods}
    tokens: dict[str, list[list[int]]] = {}
    stats: dict[str, DecodeStats] = {}
    counts: dict[str, dict] = {}
    memory: dict[str, float | None] = {}
    modules = {"draft": models.draft, "target": models.target}
    for method in methods:  # warm-up: lazy initialisation, allocator, caches
        runners[method.name](prompts[0])
    # round 0: outputs, statistics, per-model times, pass counts and memory
    oracles = [m for m in methods if m.policy is not None and m.policy.router == "oracle"]
    for method in tqdm([m for m in methods if m not in oracles] + oracles, desc="bench: check outputs",
                       disable=not progress, leave=False):
        if method in oracles and not greedy:
            outs = tokens.get("ar") or [models.generate(p, replace(method.policy, method="ar")).token_ids for p in prompts]
            greedy.update({tuple(p): out for p, out in zip(prompts, outs)})
        # transformers' passes are counted by hooks; ours by the engine itself
        counter = PassCounter(modules) if method.policy is None else None
        outs, parts = [], []
        with PeakMemory(device) as peak:
            for prompt in prompts:
                result = runners[method.name](prompt)
                if method.policy is not None:
                    outs.append(result.token_ids)
                    parts.append(result.stats)
                else:
                    outs.append(result)
        tokens[method.name], memory[method.name] = outs, peak.mb
        if counter is not None:
            counter.close()
            counts[method.name] = dict(counter.counts)
        if parts:
            stats[method.name] = DecodeStats.merge(parts)
    for name, outs in tokens.items():
        short = [i for i, o in enumerate(outs) if len(o) != max_new_tokens]
        if short:
            raise BenchError(f"{name} made {len(outs[short[0]])} tokens on prompt {short[0]}, not {max_new_tokens}: "
                             "the prompt plus max_new_tokens exceeds the model's context")
    ties = check_outputs(models, prompts, tokens)
    # every method's policy carries the same generation settings: the target as they process it scores all
    quality = quality_of(models, prompts, tokens, references, metric, next((m.policy for m in methods if m.policy), None))
    seconds, peeks, per_prompt = _timed_rounds(methods, timed, prompts, repeats, oracles, device, progress,
                                               max_new_tokens)
    result = summarise(methods, seconds, max_new_tokens * len(prompts), stats, counts, memory, peeks)
    result["intervals"] = interval_ratios(per_prompt, groups)
    for name, row in result["methods"].items():
        row["quality"] = quality[name]
    result["numerical_ties"] = ties
    return result


def _timed_rounds(methods: list[BenchMethod], timed: dict[str, Callable], prompts: list[list[int]], repeats: int,
                  oracles: list[BenchMethod], device: torch.device, progress: bool, max_new_tokens: int
                  ) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[list[float]]]]:
    """Per method its wall seconds in each of `repeats` rounds over `prompts`, per oracle each round's peek
    seconds (timed apart), and per method its seconds per generated token on each prompt of each round
    (`[round][prompt]`: ours the decode time, prefill apart; transformers' the call's wall time, prefill
    included, since `generate` does not time it apart). Interleaved by prompt: every method decodes prompt i
    before any decodes prompt i + 1, in a balanced order (`interleaved`), so a slow spell of the machine
    (seconds long on a shared CPU) falls on every method alike and a round's ratios compare the same moments."""
    from tqdm.auto import tqdm

    seconds: dict[str, list[float]] = {m.name: [] for m in methods}
    peeks: dict[str, list[float]] = {m.name: [] for m in oracles}
    per_prompt: dict[str, list[list[float]]] = {m.name: [] for m in methods}
    for r in tqdm(range(repeats), desc="bench: timed rounds", disable=not progress, leave=False):
        spent = dict.fromkeys(seconds, 0.0)
        peeked = dict.fromkeys(peeks, 0.0)
        rows = {name: [] for name in seconds}
        for i, prompt in enumerate(prompts):
            for method in interleaved(methods, r, i):
                _sync(device)
                start = time.perf_counter()
                out = timed[method.name](prompt)
                _sync(device)
                elapsed = time.perf_counter() - start
                spent[method.name] += elapsed
                if method in oracles:
                    peeked[method.name] += out.stats.peek_time_s
                own = out.stats.decode_time_s if method.policy is not None else elapsed
                rows[method.name].append(own / max_new_tokens)
        for name in seconds:
            seconds[name].append(spent[name])
            per_prompt[name].append(rows[name])
        for name in peeks:
            peeks[name].append(peeked[name])
    return seconds, peeks, per_prompt


# the interval ratios of the bench: (a, b) = a's speed over b's; `sd` is SD at its best gamma on dev when the bench
# stage found one (its JSON's `gamma_source`)
INTERVAL_PAIRS = (("viasd", "sd"), ("sd", "ar"), ("viasd", "ar"), ("viasd-oracle", "sd"), ("viasd-oracle_budget", "sd"),
                  ("viasd-rules", "sd"), ("cascade_sd", "sd"), ("spec_cascade", "sd"), ("ar", "hf_ar"),
                  ("self_sd", "sd"), ("self_sd", "hf_early_exit"), ("self_sd", "ar"),
                  ("sd", "hf_assisted"), ("sd", "hf_assisted_fixed"), ("sd", "hf_assisted_heuristic"),
                  ("sd-drafter_feature", "sd"), ("viasd-drafter_feature", "sd-drafter_feature"),
                  ("viasd-drafter_feature", "sd"), ("sd-drafter_self", "sd"),
                  ("viasd-drafter_self", "sd-drafter_self"), ("viasd-drafter_self", "sd"),
                  ("sd-tree", "sd"), ("sd-tree-drafter_feature", "sd-drafter_feature"),
                  ("sd-tree-drafter_self", "sd-drafter_self"), ("sd-tree-drafter_feature", "sd"))


def interval_ratios(per_prompt: dict[str, list[list[float]]], groups: list | None) -> dict:
    """`a_vs_b` for each pair of `INTERVAL_PAIRS` that ran: the geometric mean over prompts of b's seconds per
    token over a's (each prompt's seconds averaged over the rounds first), with its 95 % interval clustered by
    `groups` (`metrics.speed.paired_ratio`)."""
    from ..metrics.speed import mean_over_rounds, paired_ratio

    mean = {name: mean_over_rounds(rounds) for name, rounds in per_prompt.items() if rounds and rounds[0]}
    out = {}
    for a, b in INTERVAL_PAIRS:
        if a in mean and b in mean:
            out[f"{a}_vs_{b}"] = paired_ratio(mean[b], mean[a], groups)
    return out


def per_token_seconds(models: ModelSet, methods: list[BenchMethod], prompts: list[list[int]], steps: int = 32,
                      repeats: int = 3) -> dict[str, float]:
    """Seconds per generated token at the prompts' length, prefill excluded: per method, the median
    over rounds of `(t(1 + steps tokens) - t(1 token)) / steps`, rounds alternating the method order."""
    device = next(models.target.parameters()).device
    settings = generation_settings(models, methods)
    long_runs = {m.name: _runner(models, _with_length(m, steps + 1), steps + 1, settings) for m in methods}
    short_runs = {m.name: _runner(models, _with_length(m, 1), 1, settings) for m in methods}
    for m in methods:  # warm-up
        long_runs[m.name](prompts[0])
    samples: dict[str, list[float]] = {m.name: [] for m in methods}
    for r in range(repeats):
        for m in (methods if r % 2 == 0 else list(reversed(methods))):
            times = []
            for run in (short_runs[m.name], long_runs[m.name]):
                _sync(device)
                start = time.perf_counter()
                for prompt in prompts:
                    run(prompt)
                _sync(device)
                times.append(time.perf_counter() - start)
            samples[m.name].append((times[1] - times[0]) / (steps * len(prompts)))
    return {name: statistics.median(v) for name, v in samples.items()}


def _with_length(method: BenchMethod, n: int) -> BenchMethod:
    if method.policy is None:
        return method
    return replace(method, policy=replace(method.policy, max_new_tokens=n, exact_timing=False))
