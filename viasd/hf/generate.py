"""`generate`: the engine behind transformers' `GenerationMixin.generate` (its `custom_generate` hook).

Two doors, one function:
- `model.generate(**inputs, custom_generate=viasd.hf.generate, draft_model=draft, viasd_policy=policy, ...)`: a
  callable. transformers prepares the generation config (the model's, with the call's settings on top), the
  logits processors and stopping criteria, then calls it in place of its decoding loop as
  `generate(model, input_ids, logits_processor=..., stopping_criteria=..., generation_config=..., **model_kwargs)`,
  passing on the call's keyword arguments this signature names and `_sample`'s does not (`draft_model`,
  `viasd_policy`, ...). transformers 5 hands such a callable neither `assistant_model` nor `streamer`: name the draft
  `draft_model`; stream through the folder form.
- `model.generate(**inputs, custom_generate="<repo>", trust_remote_code=True, assistant_model=draft, streamer=s)`:
  transformers loads `<repo>/custom_generate/generate.py`, which calls this function with `model` and every argument
  of `generate` as given (the raw generation settings among them), `assistant_model` and `streamer` included.

What decodes: the policy (`viasd_policy`; or a finished study's run, `viasd_study=<dir>, task=..., run="viasd"`: its
slim mask, learned router and tuned thresholds, and its draft unless one is given; default: `sd` with a draft, else
`ar`) with the generation config's length (`max_new_tokens`, or `max_length` less the prompt), sampling (`do_sample`,
`temperature`, `top_k`, `top_p`; seeded by the policy's `seed`), end (`eos_token_id`, `stop_strings` with a
`tokenizer`) and per-token settings (`decoding.processors`: repetition penalty, n-gram and bad-word bans, minimum
lengths, suppressed and forced tokens), which every tier applies as `generate` does. A logits processor or stopping
criterion these settings do not describe cannot be honoured by tiers that settle tokens without the target: it is
refused by name, as are beams and several sequences per prompt.

Rows of a batch (left-padded, with the attention mask) decode together (`decoding.batching`), each to what it
decodes alone; the output is `generate`'s: the prompt and the new tokens, rows that end early padded with the pad
token, or with `return_dict_in_generate` a `ViasdGenerateOutput` whose `viasd_stats` holds each row's `DecodeStats`.
A `streamer` (folder form, one prompt) receives the prompt, then each run of new tokens as soon as no later pass
can take it back (a block's settled tokens; with `verify_lagged`, whose full-model passes may roll lagged tokens
back, at the end), then the end, as from `generate`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from ..decoding.policy import DecodePolicy
from ..decoding.processors import ProcessorSettings
from ..decoding.sampling import SamplingConfig
from ..errors import PolicyError

log = logging.getLogger(__name__)

# the processors and criteria `generate` builds from the settings the engine applies itself
KNOWN_PROCESSORS = frozenset({
    "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "RepetitionPenaltyLogitsProcessor",
    "NoRepeatNGramLogitsProcessor", "NoBadWordsLogitsProcessor", "MinLengthLogitsProcessor",
    "MinNewTokensLengthLogitsProcessor", "SuppressTokensLogitsProcessor", "SuppressTokensAtBeginLogitsProcessor",
    "ForcedBOSTokenLogitsProcessor", "ForcedEOSTokenLogitsProcessor", "InfNanRemoveLogitsProcessor"})
KNOWN_CRITERIA = frozenset({"MaxLengthCriteria", "EosTokenCriteria", "StopStringCriteria"})
# keyword arguments of `generate` that are the model's inputs or transformers' own state, not settings
MODEL_INPUTS = frozenset({"input_ids", "attention_mask", "position_ids", "use_cache", "logits_to_keep",
                          "past_key_values", "cache", "cache_position", "encoder_outputs", "token_type_ids"})


@dataclass
class ViasdGenerateOutput(GenerateDecoderOnlyOutput):
    """`generate`'s dictionary output with each row's decoding statistics (`DecodeStats`) in `viasd_stats`."""

    viasd_stats: list | None = None


def generate(model, input_ids: torch.Tensor | None = None, logits_processor=None, stopping_criteria=None,
             generation_config=None, *, draft_model=None, viasd_policy: DecodePolicy | None = None,
             slim_layers: Sequence[int] | None = None, draft_layers: Sequence[int] | None = None, viasd_router=None,
             viasd_study: str | Path | None = None,
             task: str | None = None, run: str = "viasd", viasd_batch_size: int | None = None, inputs=None,
             assistant_model=None, streamer=None, tokenizer=None, **kwargs):
    """Decode `input_ids` ([batch, prompt], left-padded with `attention_mask`) with VIA-SD or a baseline in place of
    transformers' decoding loop (see the module's docstring for the two ways in). `draft_model` (or
    `assistant_model`): the draft; `viasd_policy`: the `DecodePolicy` (method, block length, tiers); `slim_layers`:
    the slim verifier's kept layers of `model`; `draft_layers`: instead of a draft, the layers of `model` that draft
    (self-speculation under any method, `drafter: self`; under viasd the slim must keep more); `viasd_router`: a
    fitted `LearnedRouter` or its file; `viasd_study`, `task`, `run`: take the policy, slim, router (and draft) of a
    finished study's run instead. Returns
    `generate`'s output: token ids [batch, prompt + new], or with `return_dict_in_generate` a
    `ViasdGenerateOutput`."""
    config = _generation_config(model, generation_config, kwargs)
    ids = input_ids if input_ids is not None else inputs if inputs is not None else kwargs.get("input_ids")
    if ids is None:
        raise PolicyError("custom_generate with VIA-SD needs the prompt's input_ids")
    mask = kwargs.get("attention_mask")
    prompts = _prompts(ids, mask)
    _check_unsupported(config, logits_processor, stopping_criteria, kwargs)
    draft = draft_model if draft_model is not None else assistant_model
    if draft_layers is not None and (draft is not None or viasd_study is not None):
        raise PolicyError("draft_layers (the model's own layers draft) takes the place of a draft model and of a "
                          "study's run: give one of them")
    models, policy = _models_and_policy(model, draft, viasd_policy, slim_layers, viasd_router, viasd_study, task, run,
                                        tokenizer)
    if draft_layers is not None:
        models.set_self_drafter(list(draft_layers))
        policy = replace(policy if viasd_policy is not None else DecodePolicy(method="sd"), drafter="self")
    seq2seq = bool(getattr(model.config, "is_encoder_decoder", False))
    policy = _with_generation_config(policy, config, None if seq2seq else ids.shape[1], tokenizer)
    if streamer is not None and len(prompts) > 1:
        raise PolicyError("a streamer takes one prompt at a time (as transformers' streamers do)")
    if len(prompts) == 1:
        on_tokens = None
        if streamer is not None:  # generate's protocol: the prompt, then new tokens as they become final, the end
            streamer.put(ids.cpu())
            on_tokens = lambda tokens: streamer.put(torch.tensor(tokens, dtype=torch.long))  # noqa: E731
        results = [models.generate(prompts[0], policy, on_tokens=on_tokens)]
        if streamer is not None:
            streamer.end()
    else:
        results, _ = models.generate_batch(prompts, policy, batch_size=viasd_batch_size)
    new = [r.token_ids for r in results]
    sequences = _sequences(model, ids, new, config)
    if config.return_dict_in_generate:
        return ViasdGenerateOutput(sequences=sequences, viasd_stats=[r.stats for r in results])
    return sequences


def _generation_config(model, given, kwargs: dict):
    """The call's generation config: `given` (transformers' prepared one, or the caller's) or the model's, with the
    generation settings among `kwargs` (the folder form passes them raw) on top."""
    config = copy.deepcopy(given if given is not None else model.generation_config)
    settings = {k: v for k, v in kwargs.items() if k not in MODEL_INPUTS and hasattr(config, k)}
    config.update(**settings)
    return config


def _prompts(ids: torch.Tensor, mask: torch.Tensor | None) -> list[list[int]]:
    """Each row's prompt: its tokens where the attention mask is 1 (left padding dropped)."""
    if ids.dim() != 2:
        raise PolicyError(f"input_ids must be [batch, prompt], got shape {tuple(ids.shape)}")
    rows = ids.tolist()
    if mask is None:
        return rows
    return [[t for t, m in zip(row, keep) if m] for row, keep in zip(rows, mask.tolist())]


def _check_unsupported(config, logits_processor, stopping_criteria, kwargs: dict) -> None:
    for name in ("prefix_allowed_tokens_fn", "negative_prompt_ids"):
        if kwargs.get(name) is not None:
            raise PolicyError(f"{name} is not supported by VIA-SD's tiers")
    if (config.num_beams or 1) > 1 or (config.num_return_sequences or 1) > 1:
        raise PolicyError("VIA-SD decodes one sequence per prompt: num_beams and num_return_sequences must be 1")
    for proc in logits_processor or ():
        if type(proc).__name__ not in KNOWN_PROCESSORS:
            raise PolicyError(f"the logits processor {type(proc).__name__} is not one the tiers can apply (they settle "
                              "tokens without the target's pass); set the per-token settings in the generation config")
    for criterion in stopping_criteria or ():
        if type(criterion).__name__ not in KNOWN_CRITERIA:
            raise PolicyError(f"the stopping criterion {type(criterion).__name__} is not supported; VIA-SD stops at "
                              "max_new_tokens, the EOS tokens and stop_strings")


def _models_and_policy(model, draft, policy, slim_layers, router, study, task, run, tokenizer):
    """The `ModelSet` over `model` and the policy: from a study's run, or from the arguments."""
    from ..models import ModelSet

    if study is not None:
        return _study_models(model, draft, study, task, run, tokenizer)
    models = ModelSet(model, tokenizer=tokenizer, draft=draft)
    if slim_layers is not None:
        models.add_mask(list(slim_layers))
    if router is not None:
        from ..training.tier_router import load_router

        models.router = load_router(router) if isinstance(router, (str, Path)) else router
    return models, policy or DecodePolicy(method="sd" if draft is not None else "ar")


def _study_models(model, draft, study, task, run, tokenizer):
    """A finished study's run (`study.cells.study_cell`) over `model`: its routing mask, learned router and policy,
    and its draft unless one was given."""
    from ..decoding.slim import RoutingMask, num_decoder_layers
    from ..models import ModelSet, load_model
    from ..study.cells import load_pair_router, study_cell, study_policy

    cell = study_cell(study, task, run=run)
    if cell.run.ablation == "independent":
        raise PolicyError(f"run {run!r} verifies with a separate model: decode it with `viasd generate --pair ...`")
    policy = study_policy(cell)
    if draft is None and policy.needs_draft:
        draft = load_model(cell.params.pair(cell.pair).draft, device=str(model.device))
    models = ModelSet(model, tokenizer=tokenizer, draft=draft)
    mask = cell.inputs.get("mask")
    if mask is not None and policy.needs_slim:
        models.add_mask(RoutingMask.from_json(mask, num_decoder_layers(model)))
    if policy.router == "learned":
        models.router = load_pair_router(cell.params, cell.pair, policy.drafter)
    return models, policy


def _with_generation_config(policy: DecodePolicy, config, prompt_len: int | None, tokenizer) -> DecodePolicy:
    """`policy` with the call's length, sampling, end and per-token settings (`prompt_len`: a decoder-only prompt's
    padded length, which `max_length` counts)."""
    max_new = config.max_new_tokens
    if max_new is None:
        if config.max_length is None:
            raise PolicyError("give max_new_tokens (or max_length) to generate")
        max_new = config.max_length - (prompt_len or 1)
    if max_new < 1:
        raise PolicyError(f"nothing to generate: max_length {config.max_length} leaves no new token")
    sampling = SamplingConfig() if not config.do_sample else SamplingConfig(
        temperature=config.temperature if config.temperature is not None else 1.0,
        top_k=config.top_k or 0, top_p=config.top_p if config.top_p is not None else 1.0)
    eos = config.eos_token_id
    eos = None if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
    stops = config.stop_strings
    stops = () if not stops else (stops,) if isinstance(stops, str) else tuple(stops)
    if stops and tokenizer is None:
        raise PolicyError("stop_strings need the tokenizer: pass tokenizer=... to generate")
    return replace(policy, max_new_tokens=int(max_new), sampling=sampling, eos_token_ids=eos,
                   stop_strings=tuple(dict.fromkeys(policy.stop_strings + stops)), generation_config=False,
                   generation=ProcessorSettings.from_generation_config(config))


def _sequences(model, ids: torch.Tensor, new: list[list[int]], config) -> torch.Tensor:
    """`generate`'s sequences: each row's prompt (a decoder-only model's, as given, padding included; an
    encoder-decoder model's decoder start token) and its new tokens, right-padded with the pad token."""
    pad = config.pad_token_id
    if pad is None:
        eos = config.eos_token_id
        pad = (eos[0] if isinstance(eos, (list, tuple)) else eos) if eos is not None else 0
    width = max(map(len, new), default=0)
    tail = torch.full((len(new), width), int(pad), dtype=torch.long)
    for i, row in enumerate(new):
        tail[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    if getattr(model.config, "is_encoder_decoder", False):
        start = config.decoder_start_token_id
        start = model.config.decoder_start_token_id if start is None else start
        head = torch.full((len(new), 1), int(start), dtype=torch.long)
    else:
        head = ids.cpu()
    return torch.cat([head, tail], dim=1).to(ids.device)
