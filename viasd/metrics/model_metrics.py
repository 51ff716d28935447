"""Metrics every run reports that need the target model itself."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def agreement(tokens: list[int], target_greedy: list[int]) -> float:
    """Share of the target's own greedy tokens that the output reproduces position by position
    (1.0 for every lossless greedy method)."""
    if not target_greedy:
        return 1.0 if not tokens else 0.0
    same = sum(a == b for a, b in zip(tokens, target_greedy))
    return same / max(len(target_greedy), len(tokens))


@torch.inference_mode()
def target_nll(target, prompt_ids: list[int], tokens: list[int], vocab_size: int | None = None) -> float | None:
    """Mean negative log-likelihood (nats/token) the target assigns to `tokens` after the prompt."""
    if not tokens:
        return None
    device = next(target.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(tokens)], device=device)
    logits = target(input_ids=ids[:, :-1], use_cache=False, logits_to_keep=len(tokens)).logits[0]
    if vocab_size is not None:
        logits = logits[:, :vocab_size]
    return F.cross_entropy(logits.float(), ids[0, -len(tokens):]).item()
