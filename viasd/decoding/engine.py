"""The decode loop shared by every method: the token buffer, the runners, drafting and committing.

A method (`methods.base.Method`) is a block function `block(session, state)` that drafts, verifies and calls
`session.commit(n, token)` once, over the state its `set_up` made; `decode()` runs blocks until a stop rule
fires. Invariant at every block start: the last token of the sequence has not been fed to any model
(`runner.cached <= length - 1`), so one forward over `ids[cached : length + g]` returns the logits of every
block position and of the bonus position. The engine knows no method by name: what a method needs of it
(a draft with another tokenizer, a trunk shared with the full model, side runners) the `Method` declares.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import PolicyError, PromptError
from . import batching
from .batching import Batch, BatchStats
from .feature_drafter import FeatureDrafter
from .intermediate import IndependentVerifier
from .kv_cache import model_cache
from .methods import METHODS, MethodInputs
from .policy import DecodePolicy
from .processors import build, resolve
from .runner import ModelRunner
from .runner_layout import make_runners
from .sampling import Sampler, unsure
from .seq2seq import decoder_start_id, encode, is_encoder_decoder, text_config
from .slim import SlimVerifier
from .stats import DecodeStats
from .stopping import StopRule
from .text_draft import TextDraft

LOOP = "loop"  # the pseudo-layout of the decode loop's per-block work in `DecodeStats.pass_widths`


@dataclass
class DecodeResult:
    token_ids: list[int]  # new tokens only
    stats: DecodeStats
    text: str | None = None


def context_length(model: nn.Module) -> int | None:
    config = text_config(model)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class DecodeSession:
    """State of one decode: the surface every method uses (`methods.base.Session`, which documents it) and
    the method's own state (`state`, made by its `set_up`). `ids`: LongTensor `[1, capacity]`; `length`:
    committed tokens (prompt + new)."""

    def __init__(self, prompt_ids: Sequence[int], policy: DecodePolicy, target: nn.Module, vocab_size: int,
                 draft: nn.Module | None = None, slims: Sequence[SlimVerifier | IndependentVerifier] = (), tokenizer=None,
                 eos_token_ids: Sequence[int] = (), draft_tokenizer=None, inputs: MethodInputs | None = None,
                 batch: Batch | None = None, slot: int = 0, seed: int | None = None,
                 on_tokens: Callable[[list[int]], None] | None = None):
        self.policy = policy
        # a streamer's callback: given each run of new tokens once they are final (`_stream`)
        self.on_tokens = on_tokens
        self.streamed = 0
        self.batch = batch
        self.method = METHODS[policy.method]
        self.target_model = target
        self.vocab_size = vocab_size
        device = next(target.parameters()).device
        self.device = device
        prompt = list(prompt_ids)
        if not prompt:
            raise PromptError("the prompt is empty: give at least one token of text to continue")
        # an encoder-decoder target (seq2seq.py): the prompt is the encoders' input, and the decoded
        # sequence starts with the decoder start token
        self.seq2seq = is_encoder_decoder(target)
        own_model = None if isinstance(draft, FeatureDrafter) else draft  # a feature drafter is the target's own
        others = [m for m in (own_model, *(s.model for s in slims if isinstance(s, IndependentVerifier)))
                  if m is not None]
        if any(is_encoder_decoder(m) != self.seq2seq for m in others):
            raise PolicyError("the target and the draft (or independent intermediate model) must both be encoder-decoder "
                              "models or both decoder-only")
        encoder_prompt = prompt if self.seq2seq else None
        if self.seq2seq:
            prompt = [decoder_start_id(target)]
        self.prompt_len = len(prompt)
        capacity = self.capacity = self.prompt_len + policy.max_new_tokens + policy.gamma + 1
        self._check_fits(policy, capacity, encoder_prompt, target, own_model)
        self.ids = torch.zeros((1, capacity), dtype=torch.long, device=device)
        self.ids[0, : self.prompt_len] = torch.tensor(prompt, dtype=torch.long, device=device)
        self.length = self.prompt_len
        self.generated: list[int] = []
        self.done = False
        self.sampler = Sampler(policy.sampling, device, policy.seed if seed is None else seed)
        self.stop = StopRule(policy.max_new_tokens, eos_token_ids, policy.stop_strings, tokenizer)
        self.stats = DecodeStats(method=policy.method, prompt_tokens=len(encoder_prompt or prompt))

        # a draft with another tokenizer proposes through text (text_draft.py), with a sequence of its own
        self.text_draft = _text_draft(policy, self.method, draft, draft_tokenizer, tokenizer, self.seq2seq)
        layout = make_runners(policy, self.method, target, None if self.text_draft else draft, slims, vocab_size,
                              capacity)
        self.draft, self.trunk, self.slims, self.target = layout.draft, layout.trunk, layout.slims, layout.target
        own = self.text_draft.runner if self.text_draft else None
        self.runners = [r for r in (self.draft, own, self.trunk, *self.slims, self.target) if r is not None]
        self.side_runners: list[ModelRunner] = []  # the method's runners whose passes are not its work
        self.state = self.method.set_up(self, inputs or MethodInputs())
        # the method's runners and its side runners, for what every cache needs: start, the prompt's encoding,
        # rollback
        self.every_runner = [*(r for r in self.runners if r is not own), *self.side_runners]
        # the target's generation config (forced tokens, minimum lengths, banned n-grams, ...) shapes every
        # model's distributions, row by row with each row's prefix (processors.py)
        settings = resolve(target, policy.generation_config, policy.generation, policy.sampling.greedy)
        self.processors = build(settings, self.prompt_len, policy.max_new_tokens, eos_token_ids, device)
        for r in self.every_runner:
            r.processors = self.processors
            if batch is not None:  # a row of a batched decode (batching.py): its passes go through the batch
                batch.bind(r, slot)
            r.start()
        if self.text_draft is not None:
            self.text_draft.start()
        if self.seq2seq:
            self._encode(torch.tensor([encoder_prompt], dtype=torch.long, device=device))

    def _check_fits(self, policy: DecodePolicy, capacity: int, encoder_prompt, target: nn.Module,
                    draft: nn.Module | None) -> None:
        """One clear error when the prompt (with `max_new_tokens` and a block) exceeds a model's context."""
        for role, model in (("target", target), ("draft", draft)):
            limit = context_length(model) if model is not None else None
            if limit is not None and encoder_prompt is not None and len(encoder_prompt) > limit:
                raise PromptError(f"the prompt has {len(encoder_prompt)} tokens but the {role} model's encoder "
                                  f"supports {limit}")
            if limit is not None and capacity > limit:
                raise PromptError(
                    f"the prompt has {self.prompt_len} tokens; with max_new_tokens={policy.max_new_tokens} and "
                    f"gamma={policy.gamma} decoding needs {capacity} positions but the {role} model supports {limit}"
                )

    def add_side_runner(self, runner: ModelRunner) -> None:
        """A runner the method uses whose passes are not the method's work (the oracle's peeks): started,
        encoded and rolled back with the others, its seconds taken off the decode's wall time."""
        self.side_runners.append(runner)

    def _encode(self, prompt: torch.Tensor) -> None:
        """Encode the prompt once per distinct encoder module: the target's outputs serve the target and
        every slim routed out of it (they share its encoder), the draft and an independent model encode
        their own."""
        encoded = {}
        for r in self.every_runner:
            encoder = r.model.get_encoder()
            if encoder not in encoded:
                start = time.perf_counter()
                encoded[encoder] = encode(r.model, prompt)
                self.stats.encoder_time_s += time.perf_counter() - start
            r.encoder_outputs = encoded[encoder]

    @property
    def remaining(self) -> int:
        return self.policy.max_new_tokens - len(self.generated)

    def block_size(self, limit: int | None = None) -> int:
        """Draft tokens for the next block: `gamma`, fewer near `max_new_tokens`, never 0."""
        return max(1, min(self.policy.gamma, self.remaining, limit or self.policy.gamma))

    def draft_tokens(self, g: int, start: int | None = None,
                     drafter: ModelRunner | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft `g` tokens autoregressively at positions `start..start+g-1` (default: the end) with `drafter`
        (default: the draft; `self_sd` passes its slim).

        Returns `x`: LongTensor `[k]` (also written into `ids`) and the draft's logits `[k, V]`, `k = g` or, with
        `policy.draft_stop`, fewer: drafting stops after a token the draft was unsure of (`sampling.unsure`).
        The drafter's first pass catches up every token it has not seen, in parallel.
        """
        if self.text_draft is not None and drafter is None:
            return self._text_draft_tokens(g)
        start = self.length if start is None else start
        drafter = drafter or self.draft
        rows = []
        for k in range(g):
            logits = drafter.forward(self.ids, start + k, 1)[0]
            token = self.ids[0, start + k] = self.sampler.pick(logits)
            rows.append(logits)
            if unsure(self.sampler, logits, token, self.policy.draft_stop):
                break
        return self.ids[0, start : start + len(rows)].clone(), torch.stack(rows)

    def _text_draft_tokens(self, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to `g` proposals of a draft with another tokenizer, carried through text (`text_draft.py`):
        `x` `[k]` (written into `ids`), k <= g, and one-hot rows `[k, V]` (log-probabilities 0 at `x_i`,
        -inf elsewhere): each proposal is a point mass for the acceptance test."""
        tokens = self.text_draft.propose(self.ids[0, : self.length].tolist(), g)
        x = torch.tensor(tokens, dtype=torch.long, device=self.device)
        self.ids[0, self.length : self.length + len(tokens)] = x
        rows = torch.full((len(tokens), self.vocab_size), float("-inf"), device=self.device)
        rows[torch.arange(len(tokens), device=self.device), x] = 0.0
        return x, rows

    def commit(self, n_keep: int, token: torch.Tensor | int) -> None:
        """Keep the first `n_keep` block tokens, append `token`, roll every cache back, apply stop rules."""
        at = self.length + n_keep
        self.ids[0, at] = token
        new = self.ids[0, self.length : at + 1].tolist()
        self.length = at + 1
        for r in self.every_runner:
            r.rollback(min(r.cached, self.length - 1))
        self.generated.extend(new)
        keep = self.stop.cut(self.generated)
        if keep is not None:
            self.stats.truncated += len(self.generated) - keep
            del self.generated[keep:]
            self.length = self.prompt_len + keep
            self.done = True
        if self.on_tokens is not None and not self.may_rewind:
            self._stream()

    @property
    def may_rewind(self) -> bool:
        """Whether committed tokens can still be taken back: VIA-SD's lagged tokens when full-model passes check
        them (`verify_lagged`); they are streamed only when the decode ends."""
        return self.policy.method == "viasd" and self.policy.verify_lagged

    def _stream(self) -> None:
        """Hand the tokens committed since the last call to `on_tokens`."""
        if len(self.generated) > self.streamed:
            self.on_tokens(self.generated[self.streamed:])
            self.streamed = len(self.generated)

    def rewind(self, length: int) -> None:
        """Drop the committed tokens at positions `length..` (the full model rejected a lagged token);
        caches are rolled back by the `commit` that follows."""
        assert self.prompt_len <= length <= self.length, (length, self.length)
        del self.generated[length - self.prompt_len :]
        self.length = length
        self.stop.rewind(len(self.generated))

    def prefill(self) -> None:
        """Feed every model the prompt but its last token, one pass each (the trunk before the layers after
        it), recorded as the prefill: every later pass is decoding work, and the full model's lag in viasd
        counts generated tokens only. The last prompt token is fed with the first block, as every block
        feeds the last committed token (`runner.cached <= length - 1`). With every tier off no slim runs, so
        none is prefilled (tiers off is SD, pass for pass)."""
        upto = self.prompt_len - 1
        unused = set() if self.policy.runs_slim else set(self.slims)
        if upto > 0:
            for r in self.every_runner:
                if r not in unused:
                    r.prefill(self.ids, upto)
        if self.text_draft is not None:  # a draft with another tokenizer: its own encoding of the prompt's text
            self.text_draft.prefill(self.ids[0, : self.prompt_len].tolist())

    def run(self, block: Callable[[DecodeSession, object], None] | None = None) -> DecodeResult:
        """Prefill, then `block(self, self.state)` (default: the policy's method's) until a stop rule fires."""
        block = block or self.method.block
        start = time.perf_counter()
        steps = 0
        try:
            self.prefill()
            while not self.done:
                if self.batch is not None:
                    self.batch.block_start()
                block(self, self.state)
                steps += 1
        finally:
            if self.trunk is not None:
                self.trunk.close()
        stats = self.stats
        stats.wall_time_s = time.perf_counter() - start + stats.encoder_time_s  # the prompt's encoding included
        # side runners (the oracle's peeks) are not part of the method: counted apart, not in its time
        stats.wall_time_s -= sum(r.seconds for r in self.side_runners)
        self.method.finish(self, self.state)
        if self.on_tokens is not None:
            self._stream()
        stats.new_tokens = len(self.generated)
        if self.text_draft is not None:
            stats.draft_own_tokens = self.text_draft.own_tokens
        for r in self.runners:
            stats.passes[r.name] = r.passes
            stats.tokens_processed[r.name] = r.tokens
            stats.time_s[r.name] = r.seconds
            stats.layer_tokens[r.name] = r.layers * r.tokens
            for width, (passes, seconds) in r.widths.items():
                key = f"{r.name}:{r.layers}/{width}"
                stats.pass_widths[key] = passes
                stats.pass_width_s[key] = seconds
        # the decode loop's own work outside the model passes (drafting loop, sampling, tier decisions,
        # commits), per call of the method's block: what a machine with a high per-op cost adds to each block
        model_seconds = sum(r.seconds for r in self.runners) + stats.encoder_time_s
        stats.pass_widths[f"{LOOP}:{self.policy.method}/1"] = steps
        stats.pass_width_s[f"{LOOP}:{self.policy.method}/1"] = max(0.0, stats.wall_time_s - model_seconds)
        return DecodeResult(list(self.generated), stats)


def _text_draft(policy: DecodePolicy, method, draft: nn.Module | None, draft_tokenizer, tokenizer, seq2seq: bool):
    """The `TextDraft` of a draft with its own tokenizer, or None (a draft sharing the target's vocabulary)."""
    if draft is None or draft_tokenizer is None:
        return None
    if not method.text_draft:
        names = [m.name for m in METHODS.values() if m.text_draft]
        takes = " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
        raise PolicyError(f"a draft with another tokenizer than the target's runs {takes}, not {policy.method}: its "
                          "proposals have no distribution over the target's vocabulary, which that method's test needs")
    if seq2seq or tokenizer is None:
        raise PolicyError("a draft with another tokenizer needs a decoder-only pair and the target's tokenizer")
    size = min(draft.get_output_embeddings().weight.shape[0], len(draft_tokenizer))
    return TextDraft(draft, draft_tokenizer, tokenizer, lambda: model_cache(draft, "dynamic"), size, policy.exact_timing)


def decode(prompt_ids: Sequence[int], policy: DecodePolicy, target: nn.Module, vocab_size: int,
           draft: nn.Module | SlimVerifier | None = None, slims: Sequence[SlimVerifier | IndependentVerifier] = (),
           tokenizer=None, eos_token_ids: Sequence[int] = (), router=None, router_rows=None, draft_tokenizer=None,
           oracle_reference: Sequence[int] | None = None,
           on_tokens: Callable[[list[int]], None] | None = None) -> DecodeResult:
    """Decode `prompt_ids` with `policy.method`: `(models, prompt, policy) -> (tokens, stats)`. Pure:
    no files, no tracking. Greedy results are deterministic; sampled ones are fixed by `policy.seed`.

    `draft`: the draft model, a `FeatureDrafter` on the target's trunk, or a `SlimVerifier` of the target (a
    self-drafter: the target's own shallower routing, drafting with a cache of its own).
    `router`: the fitted router of `policy.router == "learned"`. `router_rows`: with the oracle router,
    every block's router features and oracle labels are appended to it (the router's training data).
    `draft_tokenizer`: the draft's own tokenizer when it is not the target's (`tokenizer`): its proposals
    are then carried through text (`text_draft.py`). `oracle_reference`: with the oracle router, the target's
    greedy output of this prompt under the same settings (an `ar` decode's tokens), which spares the oracle
    its peek passes while the output follows it (`methods.viasd.oracle_targets`): the same tokens and
    statistics either way, `peek_from_reference` counting the blocks it served. `on_tokens`: called with each run
    of new tokens as soon as no later pass can take them back (a streamer), the last ones when the decode ends."""
    _check_models(policy, draft, slims)
    session = DecodeSession(prompt_ids, policy, target, vocab_size,
                            **_session_models(policy, draft, slims, draft_tokenizer),
                            tokenizer=tokenizer, eos_token_ids=eos_token_ids,
                            inputs=MethodInputs(router, router_rows,
                                                oracle_reference if policy.router == "oracle" else None),
                            on_tokens=on_tokens)
    with torch.inference_mode():
        return session.run()


def _check_models(policy: DecodePolicy, draft, slims) -> None:
    if policy.needs_draft and draft is None:
        raise PolicyError(f"method {policy.method!r} needs a draft model")
    if policy.needs_slim and not slims:
        raise PolicyError(f"method {policy.method!r} needs a slim verifier (a routing mask over the target's layers)")


def _session_models(policy: DecodePolicy, draft, slims, draft_tokenizer=None) -> dict:
    """The models a session of `policy` takes: the draft and slims only where its method uses them."""
    return {"draft": draft if policy.needs_draft else None, "slims": slims if policy.needs_slim else (),
            "draft_tokenizer": draft_tokenizer if policy.needs_draft else None}


def decode_batch(prompts: Sequence[Sequence[int]], policy: DecodePolicy, target: nn.Module, vocab_size: int,
                 draft: nn.Module | None = None, slims: Sequence[SlimVerifier | IndependentVerifier] = (),
                 tokenizer=None, eos_token_ids: Sequence[int] = (), router=None, draft_tokenizer=None,
                 oracle_references: Sequence[Sequence[int] | None] | None = None,
                 batch_size: int | None = None, progress: Callable[[int], None] | None = None
                 ) -> tuple[list[DecodeResult], BatchStats]:
    """Decode several prompts together (`batching.py`): one `DecodeResult` per prompt, in order, and the
    batch's own statistics. At most `batch_size` rows run at once (default: every prompt); a row that ends
    frees its slot for the next prompt (continuous batching). Each row decodes exactly as `decode` would
    decode its prompt alone, with sampling seed `policy.seed + i` for the `i`-th prompt; its statistics'
    seconds include the time it waited for the other rows (its latency). `progress(n)` is called as rows end."""
    prompts = [list(p) for p in prompts]
    if not prompts:
        raise PromptError("a batched decode needs at least one prompt")
    if batch_size is not None and batch_size < 1:
        raise PolicyError(f"batch_size must be at least 1, got {batch_size}")
    if oracle_references is not None and len(oracle_references) != len(prompts):
        raise PolicyError(f"{len(oracle_references)} oracle references for {len(prompts)} prompts")
    _check_models(policy, draft, slims)
    slots = min(batch_size or len(prompts), len(prompts))
    capacity = max(len(p) for p in prompts) + policy.max_new_tokens + policy.gamma + 1
    batch = Batch(slots, capacity)
    results: list[DecodeResult | None] = [None] * len(prompts)
    queue = iter(range(len(prompts)))

    def row(slot: int):
        i = next(queue, None)
        if i is None:
            return None
        reference = oracle_references[i] if oracle_references is not None and policy.router == "oracle" else None
        session = DecodeSession(prompts[i], policy, target, vocab_size, **_session_models(policy, draft, slims,
                                                                                           draft_tokenizer),
                                tokenizer=tokenizer, eos_token_ids=eos_token_ids,
                                inputs=MethodInputs(router, None, reference), batch=batch, slot=slot,
                                seed=batching.row_seed(policy.seed, i))

        def body():
            results[i] = session.run()
            if progress is not None:
                progress(1)

        return body

    with torch.inference_mode():
        batch.run(row)
    batch.stats.new_tokens = sum(r.stats.new_tokens for r in results)
    return results, batch.stats
