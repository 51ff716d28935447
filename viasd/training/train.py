"""`viasd train-model`: train one model of the family (target, draft or independent) on the train split.

Deterministic and resumable: the batch and the layer-drop pattern of step `s` come from a generator
seeded with `(seed, role, s)`, so they do not depend on what ran before; a checkpoint (weights,
optimizer, scheduler, step) is written atomically every `checkpoint_every` steps, and a killed run
started again continues from it and ends with the same weights as an uninterrupted run.

Options:
- `layer_drop` with `layer_drop_shape` (LayerDrop / LayerSkip style, layer 0 always kept): each step
  trains a random routed view of the target, built with the same `SlimVerifier` machinery the decoder
  uses, so the model learns to work with layers skipped. `uniform` drops every layer with the same
  rate; `linear` and `exp` let the rate rise with depth to `layer_drop` at the last layer (`exp` is
  LayerSkip's `D(l) = e^{l ln 2 / (L-1)} - 1`), so late layers become the skippable ones.
- `early_exit` (LayerSkip's early-exit loss): each step also applies the final norm and LM head to the
  residual stream after one kept layer (drawn per step, or after the target's layers
  `0..early_exit_layer-1`) and adds `early_exit` times its loss, so the intermediate representations
  already predict the next token. `early_exit_loss: full` makes that loss the exit's KL to the full
  model's (detached) distribution, `KL(q_full || q_exit)`: what the slim verifier's agreement with the
  target measures, where the labels (LayerSkip's choice) teach the data.
- `self_distill` (in-place distillation of slimmable networks, with `layer_drop`): the full model
  learns the labels and, in the same step, a sub-network with layers dropped at the `layer_drop`
  rates learns the full model's distribution, `self_distill * KL(q_full || q_sub)`, so that routed
  views of the target agree with it, not just predict the data.
- `distill` (the draft learns the target's distribution, `T^2 KL(q_T || p_T)`, instead of the
  next-token labels: what raises acceptance).

Where and how: on `models.device` (the stage's GPU when it has one), with the forward passes in
`train.precision`: `float32`, `bfloat16` autocast (mixed precision: weights, gradients, optimizer state
and the losses' softmaxes stay float32, the matrix products run in bfloat16, faster on CPUs with native bfloat16
such as AVX512-BF16), or `auto`: bfloat16 where the device computes it natively, else float32 (a CPU without it
emulates bfloat16 tens of times slower). The test-split perplexity is always float32.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from ..config import ModelArch, Params, TrainParams
from ..decoding.slim import RoutingMask, SlimVerifier
from ..errors import ViasdError
from ..io import atomic_dir, write_json
from ..models import resolve_device
from .family import count_parameters, llama_config

log = logging.getLogger(__name__)
ROLES = ("target", "draft", "independent")


class TrainingError(ViasdError):
    """Training cannot start: missing data, a missing teacher, an architecture that does not fit."""


def load_token_stream(data_dir: Path, split: str) -> np.ndarray:
    import pyarrow.parquet as pq

    path = Path(data_dir) / "corpus" / f"{split}.parquet"
    if not path.exists():
        raise TrainingError(f"no {split} corpus at {path}: run `viasd prepare-data` first")
    column = pq.read_table(path, columns=["input_ids"]).column("input_ids")
    return np.concatenate([np.asarray(chunk.values, dtype=np.int64) for chunk in column.chunks])


def step_generator(seed: int, role: str, step: int) -> torch.Generator:
    key = int.from_bytes(hashlib.sha256(f"{seed}:{role}:{step}".encode()).digest()[:8], "big") % (2**63)
    return torch.Generator().manual_seed(key)


def batch_at(stream: np.ndarray, step: int, batch: int, seq_len: int, seed: int, role: str) -> torch.Tensor:
    """`[batch, seq_len + 1]` token windows for `step` (inputs are `[:, :-1]`, labels `[:, 1:]`)."""
    g = step_generator(seed, role, step)
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch,), generator=g).tolist()
    return torch.from_numpy(np.stack([stream[s : s + seq_len + 1] for s in starts]))


def drop_rates(n_layers: int, p: float, shape: str = "uniform") -> list[float]:
    """LayerDrop rate of each layer: 0 for layer 0; `p` for the others (`uniform`), or rising with the
    depth `l` to `p` at the last layer: `p * l / (L-1)` (`linear`), `p * (e^{l ln 2/(L-1)} - 1)` (`exp`)."""
    if shape not in ("uniform", "linear", "exp"):
        raise TrainingError(f"unknown layer_drop_shape {shape!r}; choose uniform, linear or exp")
    last = max(1, n_layers - 1)
    rates = []
    for layer in range(n_layers):
        depth = layer / last
        scale = 1.0 if shape == "uniform" else depth if shape == "linear" else math.exp(depth * math.log(2)) - 1
        rates.append(0.0 if layer == 0 else p * scale)
    return rates


def kept_layers(n_layers: int, p: float, step: int, seed: int, role: str, shape: str = "uniform") -> list[int]:
    """Layer 0 always; layer `l` kept with probability `1 - drop_rates(...)[l]`."""
    g = step_generator(seed, role + ":drop", step)
    draws = torch.rand(n_layers, generator=g).tolist()
    rates = drop_rates(n_layers, p, shape)
    return [0] + [i for i in range(1, n_layers) if draws[i] >= rates[i]]


def exit_point(keep: list[int], step: int, seed: int, role: str, layer: int | None = None) -> int | None:
    """How many of this step's kept layers `keep` the early-exit loss reads (1..len(keep)-1): with `layer`,
    those of the target's layers `0..layer-1` the step kept; else a number drawn per step. None when the
    exit would be the whole view (a single kept layer, or none kept from `layer` on)."""
    n_kept = len(keep)
    if layer is not None:
        below = sum(1 for i in keep if i < layer)
        return below if 0 < below < n_kept else None
    if n_kept < 2:
        return None
    g = step_generator(seed, role + ":exit", step)
    return int(torch.randint(1, n_kept, (1,), generator=g))


def native_bfloat16(device: torch.device) -> bool:
    """Whether `device` computes bfloat16 matrix products natively: a CUDA device that supports them, or a CPU
    with AVX512-BF16 or AMX (oneDNN's own check). Elsewhere bfloat16 is emulated, many times slower than float32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        native = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
        return bool(native is not None and native())
    return False


def resolve_precision(precision: str, device: torch.device) -> str:
    """`train.precision` on `device`: `auto` is bfloat16 where the device computes it natively, else float32."""
    if precision not in ("auto", "float32", "bfloat16"):
        raise TrainingError(f"unknown train.precision {precision!r}; choose auto, float32 or bfloat16")
    if precision == "auto":
        return "bfloat16" if native_bfloat16(device) else "float32"
    if precision == "bfloat16" and device.type == "cpu" and not native_bfloat16(device):
        log.warning("train.precision bfloat16 on a CPU without native bfloat16 (AVX512-BF16 or AMX): emulated, "
                    "often tens of times slower than float32 (train.precision: auto picks float32 here)")
    return precision


def autocast(precision: str, device: torch.device):
    """The forward passes' precision (resolved, `resolve_precision`): a bfloat16 autocast region, or none for
    `float32`."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bfloat16")


@torch.no_grad()
def perplexity(model, stream: np.ndarray, seq_len: int, max_tokens: int) -> tuple[float, float]:
    """(mean NLL in nats/token, perplexity) over consecutive windows of the first `max_tokens` tokens."""
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    n = min(len(stream) - 1, max_tokens)
    for start in range(0, n - seq_len, seq_len):
        window = torch.from_numpy(stream[start : start + seq_len + 1])[None].to(device)
        logits = model(input_ids=window[:, :-1], use_cache=False).logits
        total += F.cross_entropy(logits[0].float(), window[0, 1:], reduction="sum").item()
        count += seq_len
    nll = total / max(count, 1)
    return nll, math.exp(nll)


def train_model(params: Params, role: str, progress: bool = True, stop_after: int | None = None,
                on_step=None) -> Path:
    """Train `role` of the configured family; returns the saved model directory (`train_with_report`)."""
    return train_with_report(params, role, progress, stop_after, on_step)[0]


def train_with_report(params: Params, role: str, progress: bool = True, stop_after: int | None = None,
                      on_step=None) -> tuple[Path, dict | None]:
    """Train `role` of the configured family; returns the saved model directory and its training report
    (what `training.json` holds), or the checkpoint directory and None when `stop_after` ended the run.

    `stop_after` ends the run after that many optimizer steps with a checkpoint and no final model
    (a later call resumes from there). `on_step(step, loss)` is called after every optimizer step
    (e.g. to log the loss live).
    """
    from tqdm.auto import tqdm

    from ..data.tokenizer import load_tokenizer

    if role not in ROLES:
        raise TrainingError(f"unknown role {role!r}; choose one of {', '.join(ROLES)}")
    arch = params.family.arch(role)
    tp = params.train
    out_dir = params.model_dir(role)
    ckpt_dir = out_dir.parent / f".{role}.checkpoint"
    tok_dir = params.data.dir / "tokenizer"
    if not tok_dir.exists():
        raise TrainingError(f"no tokenizer at {tok_dir}: run `viasd prepare-data` first")
    tokenizer = load_tokenizer(tok_dir)
    if tp.seq_len > params.family.context:
        raise TrainingError(f"train.seq_len {tp.seq_len} exceeds the family's context {params.family.context}")
    stream = load_token_stream(params.data.dir, "train")
    device = resolve_device(params.device)
    config, model = _new_model(params, role, arch, tokenizer)
    model.to(device)
    teacher = _teacher(params, role, config.vocab_size) if arch.distill and role != "target" else None
    if teacher is not None:
        teacher.to(device)
    precision = resolve_precision(tp.precision, device)
    forward_precision = autocast(precision, device)
    tokens_per_step = tp.batch_size * tp.seq_len
    total_steps = max(1, arch.train_tokens // tokens_per_step)
    optimizer, scheduler = _optimizer(model, arch, tp, total_steps)
    ckpt = ckpt_dir / "checkpoint.pt"
    step, losses, elapsed = _resume(ckpt, role, model, optimizer, scheduler, total_steps, config, device)
    model.train()
    bar = tqdm(total=total_steps, initial=step, desc=f"train {role}", disable=not progress, unit="step")
    started = time.perf_counter() - elapsed
    while step < total_steps:
        batch = batch_at(stream, step, tp.batch_size, tp.seq_len, params.seed, role).to(device)
        with forward_precision:
            loss = step_loss(model, teacher, arch, tp, batch, step, params.seed, role)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tp.grad_clip)
        optimizer.step()
        scheduler.step()
        step += 1
        losses.append(round(loss.item(), 5))
        if on_step is not None:
            on_step(step, losses[-1])
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
        if step % tp.checkpoint_every == 0 and step < total_steps:
            _save_checkpoint(ckpt, model, optimizer, scheduler, step, total_steps, losses,
                             time.perf_counter() - started, config)
        if stop_after is not None and step >= stop_after and step < total_steps:
            _save_checkpoint(ckpt, model, optimizer, scheduler, step, total_steps, losses,
                             time.perf_counter() - started, config)
            bar.close()
            return ckpt_dir, None
    bar.close()
    train_seconds = time.perf_counter() - started
    test_stream = load_token_stream(params.data.dir, "test")
    nll, ppl = perplexity(model, test_stream, tp.seq_len, tp.eval_tokens)
    record = {"role": role, "family": params.family.name, "parameters": count_parameters(model),
              **_training_record(arch, total_steps, tokens_per_step, train_seconds, losses, nll, ppl),
              "precision": precision, "precision_asked": tp.precision, "device": device.type,
              "distilled": teacher is not None, "seed": params.seed}
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_json(tmp / "training.json", record)
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    log.info("%s: test NLL %.3f (perplexity %.2f), %.0fs", role, nll, ppl, train_seconds)
    return out_dir, record


def _optimizer(model, arch: ModelArch, tp: TrainParams, total_steps: int):
    """(AdamW, its schedule): linear warm-up, then cosine decay to a tenth of the peak rate."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=arch.lr, betas=(0.9, 0.95), weight_decay=tp.weight_decay)
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, num_warmup_steps=max(1, int(tp.warmup_fraction * total_steps)), num_training_steps=total_steps,
        min_lr_rate=0.1)
    return optimizer, scheduler


def _new_model(params: Params, role: str, arch: ModelArch, tokenizer):
    """(config, model): a Llama-layout model of `arch`, its weights drawn from the seed."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(params.seed)
    config = llama_config(arch, len(tokenizer), params.family.context, tokenizer.eos_token_id)
    try:
        return config, AutoModelForCausalLM.from_config(config)
    except ValueError as err:
        raise TrainingError(f"models.families.{params.family.name}.{role}: {err}") from None


def _training_record(arch: ModelArch, steps: int, tokens_per_step: int, seconds: float, losses: list[float],
                     nll: float, ppl: float) -> dict:
    """training.json's figures of a finished run (after role, family and parameter count)."""
    return {"steps": steps, "tokens": steps * tokens_per_step, "train_seconds": round(seconds, 1),
            "tokens_per_second": round(steps * tokens_per_step / max(seconds, 1e-9), 1),
            "final_loss": float(np.mean(losses[-20:])), "loss_curve": losses[:: max(1, len(losses) // 200)],
            "test_nll": round(nll, 4), "test_perplexity": round(ppl, 3), "layer_drop": arch.layer_drop,
            "layer_drop_shape": arch.layer_drop_shape, "early_exit": arch.early_exit,
            "early_exit_layer": arch.early_exit_layer, "early_exit_loss": arch.early_exit_loss,
            "self_distill": arch.self_distill}


def _teacher(params: Params, role: str, vocab_size: int):
    """The trained target, frozen, that a distilled `role` learns from; one clear error if it is missing or
    was trained on another vocabulary."""
    from transformers import AutoModelForCausalLM

    teacher_dir = params.model_dir("target")
    if not (teacher_dir / "config.json").exists():
        raise TrainingError(f"distilling the {role} needs the trained target at {teacher_dir}: train it first")
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir).eval().requires_grad_(False)
    if teacher.config.vocab_size != vocab_size:
        raise TrainingError(f"the target at {teacher_dir} has another vocabulary ({teacher.config.vocab_size}) "
                            f"than the tokenizer ({vocab_size}): retrain it")
    return teacher


def _resume(ckpt: Path, role: str, model, optimizer, scheduler, total_steps: int, config,
            device: torch.device) -> tuple[int, list, float]:
    """(step, losses, elapsed seconds) of a checkpoint made with the same parameters, its state loaded into
    the model, optimizer and scheduler; (0, [], 0.0) without one."""
    if not ckpt.exists():
        return 0, [], 0.0
    state = torch.load(ckpt, weights_only=False, map_location=device)
    if state["total_steps"] != total_steps or state["config"] != config.to_dict():
        log.warning("ignoring a checkpoint of %s made with other parameters", role)
        return 0, [], 0.0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    log.info("resuming %s from step %d of %d", role, state["step"], total_steps)
    return state["step"], state["losses"], state["elapsed"]


def step_loss(model, teacher, arch: ModelArch, tp: TrainParams, batch: torch.Tensor, step: int, seed: int,
              role: str) -> torch.Tensor:
    """One optimizer step's loss on `batch` `[B, T + 1]`: next-token cross-entropy (or distillation from
    `teacher`), with the step's LayerDrop, early-exit and self-distillation terms."""
    inputs, labels = batch[:, :-1], batch[:, 1:]
    keep = list(range(arch.layers))
    forward = model
    sub = None
    if arch.layer_drop > 0:
        drawn = kept_layers(arch.layers, arch.layer_drop, step, seed, role, arch.layer_drop_shape)
        view = SlimVerifier(model, RoutingMask.from_layers(drawn, arch.layers)).model
        if arch.self_distill > 0:
            sub = view  # the full model learns the labels, the sub-network the full model
        else:
            keep, forward = drawn, view
    exit_at = exit_point(keep, step, seed, role, arch.early_exit_layer) if arch.early_exit > 0 else None
    out = forward(input_ids=inputs, use_cache=False, output_hidden_states=exit_at is not None)
    target_logp = None
    if teacher is not None:
        with torch.no_grad():
            target_logits = teacher(input_ids=inputs, use_cache=False).logits.float()
            target_logp = F.log_softmax(target_logits / tp.distill_temperature, -1)
    loss = _loss(out.logits, labels, target_logp, tp.distill_temperature)
    if exit_at is not None:
        # hidden_states[j]: the residual stream after j kept layers ([B, T, hidden]); the last entry
        # already carries the final norm, intermediate ones do not
        hidden = out.hidden_states[exit_at]
        exit_logits = model.get_output_embeddings()(model.get_decoder().norm(hidden))
        if arch.early_exit_loss == "full":  # the exit learns the full model's distribution, KL(q_full || q_exit)
            exit_loss = _loss(exit_logits, labels, F.log_softmax(out.logits.detach().float(), -1), 1.0)
        else:
            exit_loss = _loss(exit_logits, labels, target_logp, tp.distill_temperature)
        loss = loss + arch.early_exit * exit_loss
    if sub is not None:
        # in-place distillation (slimmable networks): KL(q_full || q_sub), q_full held fixed
        full_logp = F.log_softmax(out.logits.detach().float(), -1)
        loss = loss + arch.self_distill * _loss(sub(input_ids=inputs, use_cache=False).logits, labels, full_logp, 1.0)
    return loss


def _loss(logits: torch.Tensor, labels: torch.Tensor, target_logp: torch.Tensor | None, t: float) -> torch.Tensor:
    """Cross-entropy on `labels` `[B, T]`, or with a teacher `T^2 KL(q_T || p_T)` against its
    log-probabilities `target_logp` `[B, T, V]` (temperature `t`)."""
    if target_logp is None:
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
    logp = F.log_softmax(logits.float() / t, -1)
    return (t * t) * F.kl_div(logp.flatten(0, 1), target_logp.flatten(0, 1), log_target=True, reduction="batchmean")


def _save_checkpoint(path: Path, model, optimizer, scheduler, step, total_steps, losses, elapsed, config) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "step": step, "total_steps": total_steps,
                "losses": losses, "elapsed": elapsed, "config": config.to_dict()}, tmp)
    os.replace(tmp, path)


