"""Side-by-side speed benchmark: our methods against `transformers` generate and assisted generation.

One process, one model load, the same prompts; greedy, batch 1, no stop rule (every method makes
exactly `max_new_tokens` tokens, so tokens/s compare like with like). Before any timing, the
lossless methods and `hf_ar` must produce the same tokens on every prompt, else `BenchError`.
Then `repeats` rounds run every method over all prompts, after a warm-up round, interleaved by prompt
(every method decodes a prompt before any decodes the next, in the balanced orders of a Williams design);
a method's tokens/s per round is its tokens over its wall time on the round's prompts.

The checks on the outputs (same tokens for the lossless methods, numerical ties in reduced
precision) and their quality (fidelity, task metric) are in `bench_outputs`.

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
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..decoding.policy import METHODS, DecodePolicy
from ..decoding.processors import ProcessorSettings, resolve
from ..decoding.seq2seq import is_encoder_decoder
from ..decoding.stats import DecodeStats
from ..decoding.tier_router import oracle_settings
from ..errors import BenchError
from ..evaluation.run_order import interleaved
from ..models import ModelSet
from .figures import summarise
from .outputs import check_outputs, quality_of, tie_gap  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

# VIA-SD variants beside the tuned `viasd`: the oracle router (the ceiling of any router: the target's greedy
# token decides, its peek passes not counted), the budgeted oracle at the fidelity floor (the ceiling of a router
# that spends the same fidelity) and the hand-set rules tuned on their own (the rules ablation)
VIASD_VARIANTS = ("viasd-oracle", "viasd-oracle_budget", "viasd-rules")
# the methods again with the feature drafter (EAGLE-3-style, on the target's trunk) in the draft model's place
FEATURE = "-drafter_feature"
FEATURE_VARIANTS = ("sd" + FEATURE, "viasd" + FEATURE)
# and with the self-drafter (`bench --draft-layers`: the target's leading layers draft; VIA-SD's slim, deeper, is the
# middle tier) with the draft model's tuned thresholds: no search has tuned them for this drafter
SELF = "-drafter_self"
SELF_VARIANTS = ("sd" + SELF, "viasd" + SELF)
# transformers' own: greedy generate, assisted generation with the draft (its heuristic schedule, and a fixed
# `gamma` tokens per round), and its self-speculation (`assistant_early_exit`: the target's first layers draft)
HF = ("hf_ar", "hf_assisted", "hf_assisted_fixed", "hf_assisted_heuristic", "hf_early_exit")
# transformers' assisted generation, by how the draft length is set: the assistant's generation config as it is
# (transformers 5's defaults: 20 tokens, stopping early where the draft's confidence falls below 0.4, the
# dynamic speculation lookahead), `gamma` fixed, and the heuristic schedule from `gamma` (+2 after a fully
# accepted round, -1 otherwise; reset per call): (num_assistant_tokens, schedule, confidence threshold)
ASSISTED = {"hf_assisted": None, "hf_assisted_fixed": ("gamma", "constant", 0.0),
            "hf_assisted_heuristic": ("gamma", "heuristic_transient", 0.0)}



@dataclass(frozen=True)
class BenchMethod:
    name: str
    policy: DecodePolicy | None = None  # ours
    # hf_assisted_*: the assistant's (num_assistant_tokens, schedule, confidence threshold); None: its own config
    assistant: tuple[int, str, float] | None = None
    early_exit: int | None = None  # hf_early_exit: the layers that draft (transformers' assistant_early_exit)


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


def method_table(models: ModelSet, names: list[str], gamma: int, max_new_tokens: int, viasd: dict | None = None,
                 spec_cascade: dict | None = None, engine: dict | None = None,
                 variants: dict[str, dict] | None = None, oracle_budget: float | None = None,
                 baselines: dict[str, dict] | None = None) -> list[BenchMethod]:
    """The benchmark's methods: ours with `gamma` (viasd with its tuned thresholds when given; `variants`:
    the settings of `VIASD_VARIANTS`, e.g. the rules' own tuned thresholds; `oracle_budget`: the budgeted
    oracle's, `1 - ` the fidelity floor; `baselines`: a lossless baseline's own settings over `gamma`, e.g.
    self_sd's and cascade_sd's best on dev), and HF's."""
    out = _methods(models, names, gamma, max_new_tokens, viasd, spec_cascade, engine, variants, oracle_budget, baselines)
    if any(m.name not in DRAFTLESS and (m.policy is None or m.policy.drafter == "model") for m in out) \
            and models.draft is None:
        raise BenchError("the speculative methods but self_sd and the -drafter_ ones need a draft model")
    return out


def _methods(models: ModelSet, names: list[str], gamma: int, max_new_tokens: int, viasd: dict | None = None,
             spec_cascade: dict | None = None, engine: dict | None = None,
             variants: dict[str, dict] | None = None, oracle_budget: float | None = None,
             baselines: dict[str, dict] | None = None) -> list[BenchMethod]:
    """The policies of `method_table`, before its check that a draft model is there for those that need one."""
    base = DecodePolicy(method="ar", gamma=gamma, max_new_tokens=max_new_tokens, eos_token_ids=(), exact_timing=True,
                        **(engine or {}))
    out = []
    for name in names:
        if name in FEATURE_VARIANTS:
            if models.feature_drafter is None:
                raise BenchError(f"{name} drafts with the pair's feature drafter: train it first (`viasd train-drafter`)")
            (own,) = _methods(models, [name[: -len(FEATURE)]], gamma, max_new_tokens, viasd, spec_cascade, engine,
                              variants, oracle_budget, baselines)
            # VIA-SD on the feature drafter with the thresholds of its own search where it ran (`variants`)
            settings = {**(baselines or {}).get(name, {}), **(variants or {}).get(name, {})}
            out.append(BenchMethod(name, replace(own.policy, drafter="feature", **settings)))
        elif name in SELF_VARIANTS:
            if models.self_drafter is None:
                raise BenchError(f"{name} drafts with the target's own layers: name them (--draft-layers 0,1)")
            (own,) = _methods(models, [name[: -len(SELF)]], gamma, max_new_tokens, viasd, spec_cascade, engine,
                              variants, oracle_budget, baselines)
            # VIA-SD on it with its own search's thresholds, SD on it at its own best gamma, where they ran
            settings = {**(baselines or {}).get(name, {}), **(variants or {}).get(name, {})}
            out.append(BenchMethod(name, replace(own.policy, drafter="self", **settings)))
        elif name == "hf_ar":
            out.append(BenchMethod(name))
        elif name in ASSISTED:
            setting = ASSISTED[name]
            out.append(BenchMethod(name, assistant=None if setting is None else (gamma, *setting[1:])))
        elif name == "hf_early_exit":
            out.append(BenchMethod(name, early_exit=early_exit_layers(models)))
        elif name == "viasd":
            out.append(BenchMethod(name, replace(base, method="viasd", **(viasd or {}))))
        elif name in VIASD_VARIANTS:
            if name == "viasd-oracle_budget" and oracle_budget is None:
                raise BenchError("viasd-oracle_budget spends the fidelity down to a floor: set "
                                 "thresholds.quality.min_fidelity below 1")
            tuned_gamma = (viasd or {}).get("gamma")
            default = {"viasd-oracle": oracle_settings(tuned_gamma),
                       "viasd-oracle_budget": oracle_settings(tuned_gamma, oracle_budget or 0.0)}.get(name, viasd)
            settings = (variants or {}).get(name, default)
            out.append(BenchMethod(name, replace(base, method="viasd", **(settings or {}))))
        elif name == "spec_cascade":
            out.append(BenchMethod(name, replace(base, method="spec_cascade", **(spec_cascade or {}))))
        elif name in METHODS:
            out.append(BenchMethod(name, replace(base, method=name, **(baselines or {}).get(name, {}))))
        else:
            raise BenchError(f"unknown benchmark method {name!r}; choose from "
                             f"{', '.join(METHODS + VIASD_VARIANTS + FEATURE_VARIANTS + SELF_VARIANTS + HF)}")
    if any(m.name in ("cascade_sd", "self_sd", "viasd", *VIASD_VARIANTS) for m in out) and not models.slims:
        raise BenchError("cascade_sd, self_sd and viasd need a slim verifier (a routing mask)")
    return out


DRAFTLESS = ("ar", "hf_ar", "self_sd", "hf_early_exit")  # methods that load no draft model


def early_exit_layers(models: ModelSet) -> int:
    """The leading layers the pair's slim keeps (`self_sd`'s early exit, when the mask is a prefix): what
    `hf_early_exit` drafts with, so that transformers' self-speculation and ours draft alike."""
    from ..decoding.reuse import prefix_length
    from ..decoding.slim import SlimVerifier

    slim = models.slims[0] if models.slims else None
    k = prefix_length(slim.mask.keep_layers) if isinstance(slim, SlimVerifier) else 0
    if not k or k != len(slim.mask.keep_layers):
        raise BenchError("hf_early_exit drafts with the target's first layers: the pair's slim must keep a prefix "
                         "of its layers (a mask 0..k-1), as the default family's DIMR mask does")
    return k


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
                  ("viasd-drafter_self", "sd-drafter_self"), ("viasd-drafter_self", "sd"))


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
