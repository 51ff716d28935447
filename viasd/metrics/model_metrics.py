"""Metrics every run reports that need the target model itself."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def agreement(tokens: list[int], target_greedy: list[int]) -> float:
    """Share of the target's own greedy tokens that the output reproduces position by position
    (1.0 for every lossless greedy method). After the first lossy token a greedy continuation mostly
    differs, so this measures where that token fell more than how many there were: see `fidelity`."""
    if not target_greedy:
        return 1.0 if not tokens else 0.0
    same = sum(a == b for a, b in zip(tokens, target_greedy))
    return same / max(len(target_greedy), len(tokens))


def _next_token_logits(target, prompt_ids: list[int], tokens: list[int]) -> torch.Tensor:
    """The target's logits `[n, V]` predicting each of `tokens` (n of them) after the prompt, in one pass:
    a causal LM over `prompt + tokens[:-1]`; an encoder-decoder model encoding the prompt and decoding
    `decoder_start + tokens[:-1]`."""
    from ..decoding.seq2seq import is_encoder_decoder, teacher_forced_logits

    device = next(target.parameters()).device
    if is_encoder_decoder(target):
        return teacher_forced_logits(target, torch.tensor([list(prompt_ids)], device=device),
                                     torch.tensor([list(tokens[:-1])], dtype=torch.long, device=device))[0]
    ids = torch.tensor([list(prompt_ids) + list(tokens)], device=device)
    return target(input_ids=ids[:, :-1], use_cache=False, logits_to_keep=len(tokens)).logits[0]


@torch.inference_mode()
def teacher_forced(target, prompt_ids: list[int], tokens: list[int], vocab_size: int | None = None,
                   policy=None, eos_token_ids: Sequence[int] = ()) -> dict | None:
    """One parallel pass of the target over `prompt + tokens` (teacher forcing).

    Returns `{"fidelity", "nll", "tokens"}`: `fidelity` is the share of `tokens` equal to the target's
    greedy choice *given the generated prefix* (`tokens[t] == argmax q(. | prompt, tokens[:t])`), so a
    lossy token counts once and does not poison the rest of the sequence; `nll` is the target's mean
    negative log-likelihood of `tokens` (nats/token). None for an empty output. With the `DecodePolicy`
    the tokens were decoded with, `q` is the target as that decode processed it (its generation config's
    processors, each row with its own prefix; `eos_token_ids` as the decode's).
    """
    from ..decoding.processors import build, resolve
    from ..decoding.seq2seq import decoder_start_id, is_encoder_decoder

    if not tokens:
        return None
    logits = _next_token_logits(target, prompt_ids, tokens)  # [n, V]
    if vocab_size is not None:
        logits = logits[:, :vocab_size]
    logits = logits.float()
    if policy is not None:
        settings = resolve(target, policy.generation_config, policy.generation, policy.sampling.greedy)
        prefix = [decoder_start_id(target)] if is_encoder_decoder(target) else list(prompt_ids)
        processors = build(settings, len(prefix), policy.max_new_tokens, eos_token_ids, logits.device)
        if processors is not None:  # row t: the prefix up to tokens[t - 1]
            ids = torch.tensor([prefix + list(tokens)], device=logits.device)
            logits = processors(ids, len(prefix) + len(tokens) - 1, logits)
    gold = torch.tensor(tokens, device=logits.device)
    return {"fidelity": (logits.argmax(-1) == gold).float().mean().item(),
            "nll": F.cross_entropy(logits, gold).item(), "tokens": len(tokens)}


def score_outputs(target, prompts: list[list[int]], outputs: list[list[int]], vocab_size: int | None = None,
                  policy=None, eos_token_ids: Sequence[int] = ()) -> tuple[dict, list[dict | None]]:
    """`teacher_forced` for each (prompt, output): the token-weighted pool and the per-output scores."""
    scores = [teacher_forced(target, p, o, vocab_size, policy, eos_token_ids) for p, o in zip(prompts, outputs)]
    return pooled(scores), scores


def fidelity_standard_error(scores: list[dict | None], groups: list | None = None) -> float | None:
    """The standard error of the pooled (token-weighted) fidelity of several outputs: a ratio estimator's
    linearised variance, with the `groups` as the sampling unit (cluster-robust; default: each output its
    own group). With M_g of the N_g tokens of group g's outputs equal to the target's greedy choice, K
    groups and f = sum M_g / sum N_g,
    SE^2 = K / (K - 1) * sum_g (M_g - f N_g)^2 / (sum_g N_g)^2.

    Why groups: prompts cut from one source file share its style and vocabulary, so a policy that does well
    on one does well on the others; counting them as independent understates the spread. None with fewer
    than two groups holding scored output (no spread to estimate)."""
    if groups is None:
        groups = list(range(len(scores)))
    if len(groups) != len(scores):
        raise ValueError(f"{len(scores)} scores, {len(groups)} groups")
    matched: dict = {}
    tokens: dict = {}
    for s, g in zip(scores, groups):
        if s and s["tokens"]:
            matched[g] = matched.get(g, 0.0) + s["fidelity"] * s["tokens"]
            tokens[g] = tokens.get(g, 0) + s["tokens"]
    k, n = len(tokens), sum(tokens.values())
    if k < 2:
        return None
    f = sum(matched.values()) / n
    residual = sum((matched[g] - f * tokens[g]) ** 2 for g in tokens)
    return (k / (k - 1) * residual) ** 0.5 / n


def pooled(scores: list[dict | None]) -> dict:
    """Token-weighted `fidelity` and `nll` over several outputs (None where nothing was generated)."""
    parts = [s for s in scores if s]
    n = sum(s["tokens"] for s in parts)
    if not n:
        return {"fidelity": None, "nll": None, "tokens": 0}
    return {"fidelity": sum(s["fidelity"] * s["tokens"] for s in parts) / n,
            "nll": sum(s["nll"] * s["tokens"] for s in parts) / n, "tokens": n}
