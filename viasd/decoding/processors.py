"""The per-token logits processors of a model's generation config, applied as `transformers.generate` does.

A checkpoint's `generation_config.json` can shape every next-token distribution: forced BOS/EOS tokens,
a minimum length, suppressed or banned tokens, no repeated n-grams, a repetition penalty. `generate`
applies them; a decoder that ignores them writes other tokens than the `generate` a user knows. Each is
a per-token choice that depends on the prefix, so decoding stays a per-token choice with them and every
method keeps its guarantees *with respect to the processed target*:

- `ProcessorSettings`: the fields below, from the target's generation config (`from_generation_config`)
  with a policy's overrides on top (`resolve`). The processors are `transformers`' own classes, built
  and ordered as `GenerationMixin._get_logits_processor` builds them (`build`).
- `RowProcessor`: a verification pass returns logits for several positions at once (`[n, V]`, the
  rows of positions `upto-n .. upto-1`); row `r` is processed with *its own* prefix
  `ids[:, : upto-n+r+1]`, exactly what `generate` would have passed at that step. Every runner (draft,
  slim, full model, the oracle's peek) and the teacher-forced fidelity use it, so the draft proposes,
  the slim scores and the target verifies the same processed distributions: `sd` is exactly lossless
  for the processed target, and the tiers score processed probabilities.

Settings that make decoding something other than one per-token choice (beam search, contrastive or
group-beam search, constraints, classifier-free guidance) cannot be honoured: a checkpoint that
defaults to them gets one logged warning and is decoded as `generate(num_beams=1, do_sample=False)`
(or sampled as the policy says). So are per-token settings this module does not build (listed in
`IGNORED`), and a checkpoint's sampling defaults (`do_sample`, `temperature`, `top_k`, `top_p`): the
policy's `sampling` decides those.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace

import torch

from ..errors import PolicyError

log = logging.getLogger(__name__)

# settings that are not a per-token choice: the value that keeps them off
NOT_PER_TOKEN = {"num_beams": 1, "num_beam_groups": 1, "penalty_alpha": None, "diversity_penalty": 0.0,
                 "constraints": None, "force_words_ids": None, "guidance_scale": 1.0, "dola_layers": None}
# per-token settings this module does not build: the value that keeps them off
IGNORED = {"sequence_bias": None, "encoder_repetition_penalty": 1.0, "encoder_no_repeat_ngram_size": 0,
           "exponential_decay_length_penalty": None, "renormalize_logits": False, "remove_invalid_values": False,
           "min_p": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None}
_reported: dict[int, weakref.ref] = {}  # generation configs already reported, by identity (configs compare by value)


def _ids(value) -> tuple[int, ...] | None:
    if value is None:
        return None
    return (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)


@dataclass(frozen=True)
class ProcessorSettings:
    """The per-token generation settings decoding honours (None: not set). As in `transformers`:
    `min_length` counts the whole sequence (a decoder-only prompt included), `min_new_tokens` the new
    tokens; `forced_eos_token_id` forces EOS at the last of `max_new_tokens`; `begin_suppress_tokens` are
    suppressed at the first new position; `bad_words_ids` are token sequences never completed."""

    forced_bos_token_id: int | None = None
    forced_eos_token_id: tuple[int, ...] | None = None
    min_length: int | None = None
    min_new_tokens: int | None = None
    suppress_tokens: tuple[int, ...] | None = None
    begin_suppress_tokens: tuple[int, ...] | None = None
    bad_words_ids: tuple[tuple[int, ...], ...] | None = None
    no_repeat_ngram_size: int | None = None
    repetition_penalty: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "forced_eos_token_id", _ids(self.forced_eos_token_id))
        for name in ("suppress_tokens", "begin_suppress_tokens"):
            object.__setattr__(self, name, _ids(getattr(self, name)))
        if self.bad_words_ids is not None:
            object.__setattr__(self, "bad_words_ids", tuple(tuple(int(t) for t in w) for w in self.bad_words_ids))
        for name in ("min_length", "min_new_tokens", "no_repeat_ngram_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise PolicyError(f"{name} must be a whole number >= 0, got {value!r}")
        if self.repetition_penalty is not None and not self.repetition_penalty > 0:
            raise PolicyError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        if self.bad_words_ids is not None and any(not w for w in self.bad_words_ids):
            raise PolicyError("bad_words_ids: every banned sequence needs at least one token id")

    @classmethod
    def parse(cls, values: Mapping) -> ProcessorSettings:
        """From a mapping (params.yaml's `decode.generation`, `--generation KEY=VALUE`): one clear error for
        an unknown field."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise PolicyError(f"unknown generation setting {', '.join(unknown)}; the per-token settings are "
                              f"{', '.join(sorted(known))}")
        return cls(**values)

    @classmethod
    def from_generation_config(cls, config) -> ProcessorSettings:
        """The settings a `transformers.GenerationConfig` holds (values that switch a processor off, such
        as `repetition_penalty: 1.0`, read as unset)."""
        if config is None:
            return cls()
        get = lambda name: getattr(config, name, None)  # noqa: E731
        penalty = get("repetition_penalty")
        return cls(
            forced_bos_token_id=get("forced_bos_token_id"), forced_eos_token_id=get("forced_eos_token_id"),
            min_length=get("min_length") or None, min_new_tokens=get("min_new_tokens") or None,
            suppress_tokens=get("suppress_tokens"), begin_suppress_tokens=get("begin_suppress_tokens"),
            bad_words_ids=get("bad_words_ids"), no_repeat_ngram_size=get("no_repeat_ngram_size") or None,
            repetition_penalty=penalty if penalty not in (None, 1.0) else None)

    def over(self, base: ProcessorSettings) -> ProcessorSettings:
        """`base` with this object's set fields on top."""
        return replace(base, **{f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None})

    @property
    def active(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))

    def as_dict(self) -> dict:
        """The set fields, JSON-ready."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = [list(w) for w in value] if f.name == "bad_words_ids" else \
                    list(value) if isinstance(value, tuple) else value
        return out


def report_unsupported(config, greedy: bool) -> None:
    """One warning per generation config for what decoding cannot or does not honour (see the module doc)."""
    if config is None:
        return
    seen = _reported.get(id(config))
    if seen is not None and seen() is config:
        return
    _reported[id(config)] = weakref.ref(config)
    odd = {k: getattr(config, k) for k, off in NOT_PER_TOKEN.items() if getattr(config, k, None) not in (None, off)}
    if odd:
        log.warning("the model's generation config asks for %s, which is not a per-token choice: decoded as "
                    "generate(num_beams=1) does", ", ".join(f"{k}={v}" for k, v in odd.items()))
    skipped = {k: getattr(config, k) for k, off in IGNORED.items() if getattr(config, k, None) not in (None, off)}
    if skipped:
        log.warning("the model's generation config sets %s, which viasd does not apply",
                    ", ".join(f"{k}={v}" for k, v in skipped.items()))
    sampling = {k: getattr(config, k) for k in ("do_sample", "temperature", "top_k", "top_p")
                if getattr(config, k, None) is not None}
    if sampling.get("do_sample") and greedy:
        log.warning("the model's generation config samples by default (%s); decoding is greedy, as the policy's "
                    "sampling says (set a temperature to sample)", ", ".join(f"{k}={v}" for k, v in sampling.items()))


def resolve(model, use_generation_config: bool, overrides: ProcessorSettings, greedy: bool = True) -> ProcessorSettings:
    """The settings a decode applies: the model's generation config (unless `use_generation_config` is
    false), with `overrides` on top."""
    config = getattr(model, "generation_config", None) if use_generation_config else None
    if config is not None:
        report_unsupported(config, greedy)
    return overrides.over(ProcessorSettings.from_generation_config(config))


def build(settings: ProcessorSettings, prompt_len: int, max_new_tokens: int, eos_token_ids: Sequence[int],
          device: torch.device):
    """`transformers`' processors for `settings`, in `generate`'s order, or None when none is set.
    `prompt_len`: the decoder-side prompt (a decoder-only prompt; an encoder-decoder model's start
    token), from which `generate` counts new tokens and places the forced EOS (`max_length`)."""
    from transformers import generation as g

    if not settings.active:
        return None
    eos = list(eos_token_ids) or None
    s = settings
    procs = g.LogitsProcessorList()
    if s.repetition_penalty is not None:
        procs.append(g.RepetitionPenaltyLogitsProcessor(s.repetition_penalty))
    if s.no_repeat_ngram_size:
        procs.append(g.NoRepeatNGramLogitsProcessor(s.no_repeat_ngram_size))
    if s.bad_words_ids is not None:
        procs.append(g.NoBadWordsLogitsProcessor([list(w) for w in s.bad_words_ids], eos))
    if s.min_length and eos is not None:
        procs.append(g.MinLengthLogitsProcessor(s.min_length, eos, device=device))
    if s.min_new_tokens and eos is not None:
        procs.append(g.MinNewTokensLengthLogitsProcessor(prompt_len, s.min_new_tokens, eos, device=device))
    if s.forced_bos_token_id is not None:
        procs.append(g.ForcedBOSTokenLogitsProcessor(s.forced_bos_token_id))
    if s.forced_eos_token_id is not None:
        procs.append(g.ForcedEOSTokenLogitsProcessor(prompt_len + max_new_tokens, list(s.forced_eos_token_id),
                                                     device=device))
    if s.suppress_tokens is not None:
        procs.append(g.SuppressTokensLogitsProcessor(list(s.suppress_tokens), device=device))
    if s.begin_suppress_tokens is not None:
        begin = prompt_len if (prompt_len > 1 or s.forced_bos_token_id is None) else prompt_len + 1
        procs.append(g.SuppressTokensAtBeginLogitsProcessor(list(s.begin_suppress_tokens), begin, device=device))
    return RowProcessor(procs) if len(procs) else None


class RowProcessor:
    """Applies a `LogitsProcessorList` to the rows of one pass, each with its own prefix."""

    def __init__(self, processors):
        self.processors = processors

    def __call__(self, ids: torch.Tensor, upto: int, logits: torch.Tensor) -> torch.Tensor:
        """`ids`: LongTensor `[1, >= upto]`; `logits`: `[n, V]`, the rows of positions `upto-n .. upto-1`
        (row `r` predicts the token after position `upto-n+r`). Returns the processed `[n, V]`."""
        n = logits.shape[0]
        rows = [self.processors(ids[:, : upto - n + r + 1], logits[r : r + 1]) for r in range(n)]
        return torch.cat(rows)
