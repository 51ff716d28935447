"""Training a feature drafter (`decoding/feature_drafter.py`) for a trained target: the target frozen, the
drafter's own layers learning the target's next-token distribution from the target's own trunk features.

Each step takes `[B, T+1]` windows, by default the target's own greedy continuations of corpus prefixes
(`target_continuations`: the text the drafter will draft for), and runs the target once over them (no
gradient), capturing its feature layers `f` `[B, T+1, F*H]` and its distributions `q_t` (the labels: the
target's own predictions, soft, as EAGLE distils them). Then:

- depth 1, every position at once: drafter position `t` reads `(f_t, x_{t+1})` and is scored on
  `KL(q_{t+1} || p_t)` (as a cross-entropy against `q_{t+1}`), `t = 0..T-1`;
- "training-time test" (EAGLE-3), depths 2..`ttt_steps`: from a cut `c` drawn per step (the start of a
  block: positions before it keep their true features in the drafter's cache), position `c + j - 1`
  reads the drafter's own output `g` of the position before instead of `f`, exactly as it drafts at
  decode time (`FeatureDraftRunner`); scored the same way, weighted `0.8^(j-1)`.

Pure training code: a target, token streams and settings in; the drafter and its report out.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch
import torch.nn.functional as F

from ..decoding.feature_drafter import FeatureDrafter, TrunkFeatures
from .train import autocast, batch_at, resolve_precision, step_generator

log = logging.getLogger(__name__)

ROLE = "feature_drafter"
DEPTH_WEIGHT = 0.8  # the weight of depth j+1 relative to depth j (EAGLE-3's training-time test)


@torch.no_grad()
def target_continuations(target, stream: np.ndarray, windows: int, prefix: int, length: int, seed: int,
                         batch: int = 64, progress: bool = True) -> torch.Tensor:
    """`[windows, length]` token windows whose first `prefix` tokens are cut from `stream` (seeded) and whose
    rest is the target's own greedy continuation of them (`generate(do_sample=False)`, batched; the prefixes
    have one length, so no padding): what the drafter proposes for at decode time is the target's text, not
    the corpus's (EAGLE-3 trains on the target's own responses for this reason)."""
    from tqdm.auto import tqdm

    device = next(target.parameters()).device
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(stream) - prefix - 1, (windows,), generator=g).tolist()
    prompts = torch.from_numpy(np.stack([stream[s : s + prefix] for s in starts]))
    out = []
    for i in tqdm(range(0, windows, batch), desc="target continuations", disable=not progress, unit="batch"):
        ids = prompts[i : i + batch].to(device)
        full = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=length - prefix, min_new_tokens=length - prefix, pad_token_id=0)
        out.append(full[:, :length].cpu())
    return torch.cat(out)


@torch.no_grad()
def target_pass(target, trunk_features: TrunkFeatures, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's feature-layer outputs `[B, T, F*H]` and log-probabilities `[B, T, V]` over `ids` `[B, T]`."""
    trunk_features.capturing = True
    try:
        logits = target(input_ids=ids, use_cache=False).logits
    finally:
        trunk_features.capturing = False
    return trunk_features.take(), F.log_softmax(logits.float(), dim=-1)


def _soft_ce(logits: torch.Tensor, target_logp: torch.Tensor) -> torch.Tensor:
    """Mean over rows of `-sum_v q(v) log p(v)` (`KL(q || p)` up to q's entropy): `[..., V]` each."""
    return -(target_logp.exp() * F.log_softmax(logits.float(), dim=-1)).sum(-1).mean()


def drafter_loss(drafter: FeatureDrafter, features: torch.Tensor, target_logp: torch.Tensor, ids: torch.Tensor,
                 cut: int, ttt_steps: int) -> tuple[torch.Tensor, list[float]]:
    """The step's loss and each depth's loss value. `features` `[B, T, F*H]`, `target_logp` `[B, T, V]` and `ids`
    `[B, T]` of one window batch; `cut`: the block start of the training-time test (1 <= cut <= T - ttt_steps - 1)."""
    T = ids.shape[1]
    cache = drafter.new_cache()
    logits, g = drafter(features[:, : T - 1], ids[:, 1:], cache=cache)  # position t predicts x_{t+2}
    vocab = target_logp.shape[-1]
    losses = [_soft_ce(logits[..., :vocab], target_logp[:, 1:])]
    cache.crop(cut - (T - 1))  # keep positions 0..cut-1, fed their true features
    own = g[:, cut - 1 : cut]
    for j in range(1, ttt_steps):
        t = cut + j - 1
        logits_j, own = drafter(own, ids[:, t + 1 : t + 2], cache=cache, own=True)
        losses.append(_soft_ce(logits_j[..., :vocab], target_logp[:, t + 1 : t + 2]))
    total = sum(DEPTH_WEIGHT ** j * loss for j, loss in enumerate(losses))
    return total, [round(loss.item(), 5) for loss in losses]


@torch.no_grad()
def draft_agreement(drafter: FeatureDrafter, target, trunk_features: TrunkFeatures, windows: torch.Tensor,
                    ttt_steps: int) -> list[float]:
    """How often the drafter's argmax is the target's, per depth (1 = from true features, j = after j-1 steps on
    its own outputs), on `windows` `[N, T]` with block starts spread over each window's second half: what greedy
    speculative decoding accepts at each draft position, teacher-forced (depth j counts only where depth j-1
    agreed, as a chain draft is accepted)."""
    drafter.eval()
    hits = [0] * ttt_steps
    total = 0
    device = next(drafter.parameters()).device
    for w in range(len(windows)):
        ids = windows[w : w + 1].to(device)
        feats, logp = target_pass(target, trunk_features, ids)
        T = ids.shape[1]
        for cut in range(T // 2, T - ttt_steps - 1, max(1, T // 16)):
            cache = drafter.new_cache()
            logits, g = drafter(feats[:, :cut], ids[:, 1 : cut + 1], cache=cache)
            own = g[:, -1:]
            right = bool(logits[0, -1, : logp.shape[-1]].argmax() == logp[0, cut].argmax())
            hits[0] += right
            for j in range(1, ttt_steps):
                t = cut + j - 1
                logits_j, own = drafter(own, ids[:, t + 1 : t + 2], cache=cache, own=True)
                right = right and bool(logits_j[0, -1, : logp.shape[-1]].argmax() == logp[0, t + 1].argmax())
                hits[j] += right
            total += 1
    drafter.train()
    return [h / max(1, total) for h in hits]


def train_feature_drafter(target, train_stream: np.ndarray, test_stream: np.ndarray, trunk_layers: int, *,
                          train_tokens: int, lr: float, ttt_steps: int, batch_size: int, seq_len: int,
                          weight_decay: float, grad_clip: float, warmup_fraction: float, precision: str, seed: int,
                          eval_windows: int = 16, continuations: torch.Tensor | None = None, progress: bool = True,
                          on_step=None) -> tuple[FeatureDrafter, dict]:
    """Train a `FeatureDrafter` on `target`'s trunk (its first `trunk_layers` layers) for `train_tokens` tokens;
    returns it (eval mode) and its report: steps, seconds, the loss curve, per-depth agreement on the test
    stream. `continuations` `[N, seq_len + 1]` (`target_continuations`): each step's windows are drawn from these
    (seeded) instead of cut from `train_stream`. `on_step(step, loss)` is called after every optimizer step."""
    from tqdm.auto import tqdm
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    if ttt_steps < 1:
        raise ValueError(f"ttt_steps must be at least 1, got {ttt_steps}")
    device = next(target.parameters()).device
    target.eval()  # frozen: its pass runs without gradient and the drafter reads its weights detached
    torch.manual_seed(seed)
    drafter = FeatureDrafter(target, trunk_layers)
    drafter.train()
    capture = TrunkFeatures(target, drafter.layers)
    params = [p for p in drafter.parameters() if p.requires_grad]
    steps = max(1, train_tokens // (batch_size * seq_len))
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, num_warmup_steps=max(1, int(warmup_fraction * steps)), num_training_steps=steps, min_lr_rate=0.1)
    precision = resolve_precision(precision, device)
    precision_ctx = autocast(precision, device)
    losses, depth_losses = [], []
    started = time.perf_counter()
    bar = tqdm(total=steps, desc="train feature drafter", disable=not progress, unit="step")
    try:
        for step in range(steps):
            if continuations is None:
                ids = batch_at(train_stream, step, batch_size, seq_len, seed, ROLE).to(device)
            else:
                rows = torch.randint(0, len(continuations), (batch_size,), generator=step_generator(seed, ROLE, step))
                ids = continuations[rows].to(device)
            cut = int(torch.randint(seq_len // 4, seq_len - ttt_steps, (1,),
                                    generator=step_generator(seed, ROLE + ":cut", step)))
            with precision_ctx:
                feats, logp = target_pass(target, capture, ids)
                loss, per_depth = drafter_loss(drafter, feats, logp, ids, cut, ttt_steps)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
            optimizer.step()
            scheduler.step()
            losses.append(round(loss.item(), 5))
            depth_losses.append(per_depth)
            if on_step is not None:
                on_step(step + 1, losses[-1])
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
        seconds = time.perf_counter() - started
        if continuations is None:
            held_out = torch.cat([batch_at(test_stream, w, 1, seq_len, seed, ROLE + ":eval") for w in range(eval_windows)])
        else:  # the target's continuations of held-out prefixes, as it trained
            held_out = target_continuations(target, test_stream, eval_windows, seq_len // 4, seq_len + 1, seed,
                                            progress=False)
        agreement = draft_agreement(drafter, target, capture, held_out, ttt_steps)
    finally:
        bar.close()
        capture.remove()
    drafter.eval()
    report = {"trunk_layers": trunk_layers, "feature_layers": list(drafter.layers), "steps": steps,
              "data": "target continuations" if continuations is not None else "corpus",
              "tokens": steps * batch_size * seq_len, "train_seconds": round(seconds, 1), "ttt_steps": ttt_steps,
              "parameters": sum(p.numel() for p in drafter.parameters()), "loss_curve": losses,
              "final_loss": float(np.mean(losses[-20:])),
              "final_depth_losses": [float(np.mean([d[j] for d in depth_losses[-20:]])) for j in range(ttt_steps)],
              "test_agreement_by_depth": agreement, "precision": precision, "seed": seed}
    log.info("feature drafter: %d steps in %.0fs, test agreement by depth %s", steps, seconds,
             ", ".join(f"{a:.3f}" for a in agreement))
    return drafter, report
