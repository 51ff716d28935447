"""Loading Hugging Face causal LMs and tokenizers, and the `ModelSet` a decode runs on.

Any decoder-only causal LM works, from a local directory or a hub id (users with network access
pass ids like `Qwen/Qwen2.5-0.5B`). `trust_remote_code` stays off unless asked; safetensors weights
are preferred.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .decoding.batching import BatchStats
from .decoding.engine import DecodeResult, decode, decode_batch
from .decoding.intermediate import IndependentVerifier
from .decoding.policy import DecodePolicy
from .decoding.seq2seq import is_encoder_decoder
from .decoding.slim import RoutingMask, SlimVerifier, num_decoder_layers
from .decoding.tier_router import LearnedRouter, RouterRows
from .errors import ModelLoadError, PolicyError, PromptError, VocabularyMismatchError

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ModelLoadError(f"unknown device {device!r}; use cpu, cuda, cuda:N, mps or auto") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} was asked for but this machine has no CUDA device")
    return dev


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _looks_local(name: str) -> bool:
    """A path rather than a hub id (`org/name` has exactly one slash and no leading ./ or ~)."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or (os.sep != "/" and os.sep in name)


def load_model(name_or_path: str | Path, device: str = "auto", dtype: str = "auto",
               trust_remote_code: bool = False, revision: str | None = None) -> nn.Module:
    """A causal LM, or an encoder-decoder LM (detected from its config: `AutoModelForSeq2SeqLM`), in eval
    mode on `device`. Errors name the model and what to do."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    name = str(name_or_path)
    local = Path(name).expanduser()
    if not local.exists() and _looks_local(name):
        raise ModelLoadError(f"model path {name} does not exist")
    source = str(local) if local.exists() else name
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, revision=revision)
    except (OSError, ValueError) as err:
        where = f"directory {source}" if local.exists() else f"'{name}' on the Hugging Face Hub"
        hint = "" if local.exists() else " (offline? download it and pass its local directory)"
        raise ModelLoadError(f"cannot load the model config from {where}{hint}: {str(err).splitlines()[0]}") from None
    auto = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
    try:
        model = auto.from_pretrained(
            source, config=config, dtype=torch_dtype, trust_remote_code=trust_remote_code, revision=revision,
        )
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load the model weights of {name}: {str(err).splitlines()[0]}") from None
    model.to(dev)
    model.eval()
    model.requires_grad_(False)
    log.info("loaded %s (%s, %d layers) on %s as %s", name, config.model_type, num_decoder_layers(model), dev, torch_dtype)
    return model


def _same_kind(target: nn.Module, other: nn.Module, role: str) -> None:
    """Both decoder-only, or both encoder-decoder: decoding feeds them the same sequence."""
    kinds = ["an encoder-decoder model" if is_encoder_decoder(m) else "a decoder-only model"
             for m in (target, other)]
    if kinds[0] != kinds[1]:
        raise ModelLoadError(f"the target is {kinds[0]} but the {role} is {kinds[1]}; a pair must be of one kind")


def load_tokenizer(name_or_path: str | Path, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(name_or_path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError) as err:
        raise ModelLoadError(f"cannot load a tokenizer from {name_or_path}: {str(err).splitlines()[0]}") from None


def output_vocab(model: nn.Module) -> int:
    return model.get_output_embeddings().weight.shape[0]


def _regular_size(tokenizer) -> int:
    """1 + the largest id of a token that is not an added (special) token: the ids a model must emit."""
    added = set(getattr(tokenizer, "added_tokens_decoder", None) or {})
    ids = [i for i in tokenizer.get_vocab().values() if i not in added]
    return max(ids) + 1 if ids else 0


def _mismatched_ids(tokenizer, draft_tokenizer, limit: int) -> list[tuple[int, str, str]]:
    """Ids below `limit` that the two tokenizers map to different tokens (an id only one knows is not a
    mismatch: decoding reads the target's tokenizer)."""
    target_map = {i: t for t, i in tokenizer.get_vocab().items() if i < limit}
    draft_map = {i: t for t, i in draft_tokenizer.get_vocab().items() if i < limit}
    return sorted((i, target_map[i], draft_map[i]) for i in target_map.keys() & draft_map.keys()
                  if target_map[i] != draft_map[i])


def other_vocabulary(target: nn.Module, draft: nn.Module | None, tokenizer, draft_tokenizer) -> bool:
    """Whether the draft speaks another vocabulary: both tokenizers known, and some id both output layers
    emit maps to another token in each (`shared_vocab_size` then does not apply)."""
    if draft is None or tokenizer is None or draft_tokenizer is None:
        return False
    if is_encoder_decoder(target):
        return False  # not supported for encoder-decoder pairs: shared_vocab_size's error names the mismatch
    return bool(_mismatched_ids(tokenizer, draft_tokenizer, min(output_vocab(target), output_vocab(draft))))


def shared_vocab_size(target: nn.Module, draft: nn.Module | None, tokenizer=None, draft_tokenizer=None) -> int:
    """The ids both models can emit and decoding uses; logits are cut to it (embeddings are often padded).

    What decoding relies on is checked, not the tokenizers' lengths: over the ids both output layers
    can emit, the two tokenizers must map every id they both know to the same token, and every regular
    (non-added) token of the target's tokenizer must be an id the models can emit. An added special
    token beyond the output layers (Qwen2's tokenizer class adds one on load) is not a mismatch: no
    model can emit it. Without tokenizers the output layers must have the same size.
    """
    v_target = output_vocab(target)
    if draft is None:
        return min(v_target, len(tokenizer)) if tokenizer is not None else v_target
    v_draft = output_vocab(draft)
    if tokenizer is not None and draft_tokenizer is not None:
        emit = min(v_target, v_draft)
        bad = _mismatched_ids(tokenizer, draft_tokenizer, emit)
        if bad:
            shown = "; ".join(f"id {i} is {a!r} for the target, {b!r} for the draft" for i, a, b in bad[:3])
            raise VocabularyMismatchError(
                f"the draft's tokenizer maps {len(bad)} of the ids both models emit to other tokens than the "
                f"target's ({shown}): speculative decoding needs one shared vocabulary")
        regular = _regular_size(tokenizer)
        if regular > emit:
            raise VocabularyMismatchError(
                f"the tokenizer has {regular} regular tokens but a model's output layer has only {emit}")
        return min(emit, len(tokenizer))
    if v_target != v_draft:
        raise VocabularyMismatchError(
            f"the draft's output vocabulary ({v_draft}) differs from the target's ({v_target}): "
            "speculative decoding needs one shared vocabulary"
        )
    return v_target


def eos_ids(model: nn.Module, tokenizer=None) -> tuple[int, ...]:
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is not None:
            return tuple(value) if isinstance(value, (list, tuple)) else (int(value),)
    return ()


@dataclass
class ModelSet:
    """Target, optional draft and slim verifiers, and the tokenizer: what `generate` decodes with."""

    target: nn.Module
    tokenizer: object | None = None
    draft: nn.Module | None = None
    slims: list[SlimVerifier] = field(default_factory=list)
    draft_tokenizer: object | None = None
    router: LearnedRouter | None = None  # viasd `router: learned`: the fitted router of the (first) slim
    feature_drafter: nn.Module | None = None  # `drafter: feature` policies: a `FeatureDrafter` on the target's trunk
    feature_router: LearnedRouter | None = None  # the learned router refitted on the feature drafter's blocks
    # `drafter: self` policies: a shallower routing of the target that drafts (`set_self_drafter`)
    self_drafter: SlimVerifier | None = None
    self_router: LearnedRouter | None = None  # the learned router refitted on the self-drafter's blocks

    def __post_init__(self):
        if self.draft is not None:
            _same_kind(self.target, self.draft, "draft")
        # a draft whose tokenizer maps ids to other tokens: its proposals are carried through text
        # (decoding/text_draft.py); a shared vocabulary is the fast path
        self.cross_vocab = other_vocabulary(self.target, self.draft, self.tokenizer, self.draft_tokenizer)
        if self.cross_vocab:
            log.info("the draft has its own tokenizer: its proposals are carried into the target's tokens through text")
        self.vocab_size = shared_vocab_size(self.target, None if self.cross_vocab else self.draft, self.tokenizer,
                                            self.draft_tokenizer)

    def with_slims(self, slims: Sequence[SlimVerifier | IndependentVerifier]) -> ModelSet:
        """The same target, draft and tokenizers (shared, not copied) with `slims` as the verifiers: one
        load of the pair serves runs that differ only in their slim."""
        import copy

        view = copy.copy(self)
        view.slims = list(slims)
        return view

    def add_mask(self, mask: RoutingMask | Sequence[int]) -> SlimVerifier:
        if not isinstance(mask, RoutingMask):
            mask = RoutingMask.from_layers(list(mask), num_decoder_layers(self.target), source="keep_layers")
        slim = SlimVerifier(self.target, mask)
        self.slims.append(slim)
        return slim

    def set_self_drafter(self, mask: RoutingMask | Sequence[int]) -> SlimVerifier:
        """Self-speculation under any drafting method (`drafter: self`): the target routed through `mask` drafts.
        Its layers are its own pass with its own cache (not shared with a slim's or the full model's), so under
        the tiered methods it pays only where it is much shallower than the slim tier, which must keep more
        layers than it (checked when a policy decodes with it)."""
        if not isinstance(mask, RoutingMask):
            mask = RoutingMask.from_layers(list(mask), num_decoder_layers(self.target), source="draft_layers")
        self.self_drafter = SlimVerifier(self.target, mask)
        return self.self_drafter

    def add_independent(self, model: nn.Module, tokenizer=None) -> IndependentVerifier:
        """Use a separately trained model as an intermediate verifier (the independent ablation)."""
        if tokenizer is not None and self.tokenizer is not None and tokenizer.get_vocab() != self.tokenizer.get_vocab():
            raise VocabularyMismatchError("the independent intermediate model's vocabulary differs from the target's")
        if output_vocab(model) < self.vocab_size:
            raise VocabularyMismatchError(
                f"the independent intermediate model's output layer has {output_vocab(model)} tokens, fewer than "
                f"the {self.vocab_size} the target and draft share")
        _same_kind(self.target, model, "independent intermediate model")
        verifier = IndependentVerifier(model)
        self.slims.append(verifier)
        return verifier

    def add_independent_from(self, name_or_path, device: str = "auto", dtype: str = "auto",
                             trust_remote_code: bool = False) -> IndependentVerifier:
        """Load a separately trained model (directory or hub id) and add it as an intermediate verifier."""
        model = load_model(name_or_path, device, dtype, trust_remote_code)
        model.to(next(self.target.parameters()).device)
        return self.add_independent(model, _optional_tokenizer(name_or_path, trust_remote_code))

    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise PromptError("a text prompt needs a tokenizer; pass token ids instead")
        if not prompt:
            raise PromptError("the prompt is empty: give some text to continue")
        return self.tokenizer(prompt, add_special_tokens=True)["input_ids"]

    def eos_token_ids(self, policy: DecodePolicy) -> tuple[int, ...]:
        """The tokens that end a decode with `policy`: its own, else the target's."""
        return tuple(policy.eos_token_ids) if policy.eos_token_ids is not None else eos_ids(self.target, self.tokenizer)

    def score(self, prompts: list[list[int]], outputs: list[list[int]], policy: DecodePolicy) -> tuple[dict, list]:
        """Fidelity and NLL of each output under the target as `policy` decodes with it (its generation
        config's processors included): `metrics.model_metrics.score_outputs`."""
        from .metrics.model_metrics import score_outputs

        return score_outputs(self.target, prompts, outputs, self.vocab_size, policy, self.eos_token_ids(policy))

    def generate(self, prompt: str | Sequence[int] | Sequence[str | Sequence[int]], policy: DecodePolicy | None = None,
                 router_rows: RouterRows | None = None, oracle_reference: Sequence[int] | None = None,
                 batch_size: int | None = None, on_tokens=None, **overrides) -> DecodeResult | list[DecodeResult]:
        """Decode a text prompt (or token ids) and return new token ids, text and statistics (`router_rows`:
        with the oracle router, collect the router's training rows; `oracle_reference`: with it, the target's
        greedy output of this prompt under the same policy, which spares the oracle its peek passes).

        A list of prompts (texts or token-id lists) decodes them as a batch (`generate_batch`, at most
        `batch_size` rows at once) and returns one result per prompt, each what its prompt decodes to alone.
        `on_tokens` (one prompt): called with new token ids as they become final (`decode`'s streamer hook)."""
        if _is_batch(prompt):
            if router_rows is not None or oracle_reference is not None or on_tokens is not None:
                raise PolicyError("router_rows, oracle_reference and on_tokens are per prompt: decode those prompts one "
                                  "at a time")
            return self.generate_batch(prompt, policy, batch_size=batch_size, **overrides)[0]
        policy = self._policy(policy, overrides)
        draft, router = self._drafter(policy)
        result = decode(self._ids(prompt), policy, self.target, self.vocab_size, draft=draft, slims=self.slims,
                        tokenizer=self.tokenizer, eos_token_ids=self.eos_token_ids(policy), router=router,
                        router_rows=router_rows, oracle_reference=oracle_reference,
                        draft_tokenizer=self.draft_tokenizer if self.cross_vocab else None, on_tokens=on_tokens)
        self._add_text(result)
        return result

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], policy: DecodePolicy | None = None,
                       batch_size: int | None = None, oracle_references: Sequence[Sequence[int]] | None = None,
                       progress=None, **overrides) -> tuple[list[DecodeResult], BatchStats]:
        """Decode `prompts` together (`decoding.batching`): one result per prompt, in order, and the batch's own
        statistics (batched passes, wall time). At most `batch_size` rows at once (default: all); a finished
        row's slot takes the next prompt. The `i`-th prompt samples with seed `policy.seed + i`."""
        policy = self._policy(policy, overrides)
        draft, router = self._drafter(policy)
        results, stats = decode_batch([self._ids(p) for p in prompts], policy, self.target, self.vocab_size,
                                      draft=draft, slims=self.slims, tokenizer=self.tokenizer,
                                      eos_token_ids=self.eos_token_ids(policy), router=router,
                                      draft_tokenizer=self.draft_tokenizer if self.cross_vocab else None,
                                      oracle_references=oracle_references, batch_size=batch_size, progress=progress)
        for result in results:
            self._add_text(result)
        return results, stats

    @staticmethod
    def _policy(policy: DecodePolicy | None, overrides: dict) -> DecodePolicy:
        policy = policy or DecodePolicy()
        if overrides:
            from dataclasses import replace

            policy = replace(policy, **overrides)
        return policy

    def _ids(self, prompt: str | Sequence[int]) -> list[int]:
        return self.encode(prompt) if isinstance(prompt, str) else list(prompt)

    def _drafter(self, policy: DecodePolicy):
        """The draft and router `policy` decodes with: the draft model's, the feature drafter's, or the self-drafter's
        (each drafter's own router where one was fitted on its blocks, else `router`)."""
        draft, router = self.draft, self.router
        if policy.drafter == "feature":
            router = self.feature_router or router
            if self.feature_drafter is None:
                raise PolicyError("drafter: feature needs a feature drafter (`viasd train-drafter`; "
                                  "ModelSet.feature_drafter, or load_models(feature_drafter=...))")
            draft = self.feature_drafter
        elif policy.drafter == "self":
            router = self.self_router or router
            draft = self._self_drafter(policy)
        return draft, router

    def _self_drafter(self, policy: DecodePolicy) -> SlimVerifier:
        if self.self_drafter is None:
            raise PolicyError("drafter: self needs the layers the target drafts with (ModelSet.set_self_drafter, "
                              "or --draft-layers)")
        if policy.runs_slim:
            kept = len(self.self_drafter.mask.keep_layers)
            shallow = [s for s in self.slims if isinstance(s, SlimVerifier) and len(s.mask.keep_layers) <= kept]
            if shallow:
                raise PolicyError(f"the slim tier keeps {len(shallow[0].mask.keep_layers)} layers but the self-drafter "
                                  f"{kept}: under {policy.method} the slim is the middle tier between the self-drafter "
                                  "and the full model, so it must keep more layers than the drafter")
        return self.self_drafter

    def _add_text(self, result: DecodeResult) -> None:
        if self.tokenizer is not None:
            result.text = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)


def _is_batch(prompt) -> bool:
    """A list of prompts (texts or token-id lists), not one prompt (a text or a list of token ids)."""
    return not isinstance(prompt, str) and len(prompt) > 0 and not isinstance(prompt[0], int | torch.Tensor)


def load_models(target: str | Path, draft: str | Path | None = None, masks: Sequence = (),
                device: str = "auto", dtype: str = "auto", trust_remote_code: bool = False,
                independent: str | Path | None = None, feature_drafter: str | Path | None = None) -> ModelSet:
    """Load a target (and draft) and route slim verifiers through `masks` (mask files, `RoutingMask`s or
    lists of layer indices); `independent` adds a separately trained intermediate model after them;
    `feature_drafter` a feature drafter's directory (`viasd train-drafter`), over the target's trunk.
    The tokenizer is the target's."""
    target_model = load_model(target, device, dtype, trust_remote_code)
    draft_model = load_model(draft, device, dtype, trust_remote_code) if draft is not None else None
    if draft_model is not None:
        target_device = next(target_model.parameters()).device
        draft_model.to(target_device)
    tokenizer = _optional_tokenizer(target, trust_remote_code)
    draft_tokenizer = _optional_tokenizer(draft, trust_remote_code) if draft is not None else None
    models = ModelSet(target_model, tokenizer, draft_model, draft_tokenizer=draft_tokenizer)
    n_layers = num_decoder_layers(target_model)
    for mask in masks:
        if isinstance(mask, (str, Path)):
            mask = RoutingMask.from_json(mask, n_layers)
        models.add_mask(mask)
    if independent is not None:
        models.add_independent_from(independent, device, dtype, trust_remote_code)
    if feature_drafter is not None:
        from .decoding.feature_drafter import load_feature_drafter

        models.feature_drafter = load_feature_drafter(feature_drafter, target_model)
    return models


def _optional_tokenizer(name_or_path, trust_remote_code: bool):
    path = Path(str(name_or_path)).expanduser()
    files = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
    if path.is_dir() and not any((path / f).exists() for f in files):
        return None
    return load_tokenizer(name_or_path, trust_remote_code)
