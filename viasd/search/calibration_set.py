"""Teacher-forced log-probabilities on the calibration set, computed once per search and reused by
every trial, so a trial costs one slim forward pass over the calibration tokens."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from ..errors import ViasdError


class CalibrationError(ViasdError):
    """The calibration set is missing, empty or unusable."""


def load_calibration(path: Path) -> torch.Tensor:
    """LongTensor `[N, T]` of token windows from `calibration.parquet`."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.exists():
        raise CalibrationError(f"calibration set {path} does not exist: run `viasd prepare-data` first")
    rows = pq.read_table(path, columns=["input_ids"]).column("input_ids").to_pylist()
    rows = [r for r in rows if r]
    if not rows:
        raise CalibrationError(f"calibration set {path} is empty")
    length = min(map(len, rows))
    if length < 2:
        raise CalibrationError(f"calibration set {path} has windows shorter than 2 tokens")
    return torch.tensor([r[:length] for r in rows], dtype=torch.long)


@torch.inference_mode()
def window_logits(model, batch: torch.Tensor) -> torch.Tensor:
    """Teacher-forced logits of `model` on calibration windows `batch` `[B, T-1]` (each window without its
    last token). A causal LM predicts tokens `1..T-1` of the window: `[B, T-1, V]`. An encoder-decoder
    model (T5, BART) reads the window's first half `h = T // 2` tokens as its source and predicts the
    rest as its target, decoding from its start token: `[B, T-h, V]`, tokens `h..T-1`. Every model of a
    pair (and every slim view) splits a window alike, so their distributions are position for position."""
    from ..decoding.seq2seq import is_encoder_decoder, teacher_forced_logits

    if not is_encoder_decoder(model):
        return model(input_ids=batch, use_cache=False).logits
    h = source_length(batch.shape[1] + 1)
    return teacher_forced_logits(model, batch[:, :h], batch[:, h:])


def source_length(window: int) -> int:
    """Tokens of a calibration window of `window` tokens that an encoder-decoder model reads as its source."""
    return window // 2


def window_targets(tokens: torch.Tensor, encoder_decoder: bool) -> torch.Tensor:
    """The tokens `window_logits` predicts: `tokens[:, 1:]` (causal) or the second half (encoder-decoder)."""
    return tokens[:, source_length(tokens.shape[1]) :] if encoder_decoder else tokens[:, 1:]


def log_probs(forward, tokens: torch.Tensor, vocab_size: int, batch_size: int = 8) -> torch.Tensor:
    """`forward(input_ids) -> logits`; returns float32 log-probabilities `[N, T-1, V]` predicting
    tokens `1..T-1` of each window."""
    out = []
    for start in range(0, tokens.shape[0], batch_size):
        batch = tokens[start : start + batch_size, :-1]
        logits = forward(batch)[..., :vocab_size].float()
        out.append(F.log_softmax(logits, dim=-1).cpu())
    return torch.cat(out)


def spread_windows(stream, sequences: int, length: int) -> torch.Tensor:
    """LongTensor `[n, length]` of windows at evenly spaced offsets of a 1-D token `stream` (numpy or
    list), `n = min(sequences, len(stream) // length)`: a fixed sample of a whole split."""
    n = min(sequences, len(stream) // length)
    if n < 1:
        raise CalibrationError(f"a stream of {len(stream)} tokens holds no window of {length}")
    step = (len(stream) - length) // max(1, n - 1) if n > 1 else 0
    return torch.tensor([list(stream[i * step : i * step + length]) for i in range(n)], dtype=torch.long)


@torch.inference_mode()
def greedy_choices(forward, tokens: torch.Tensor, vocab_size: int, batch_size: int = 8,
                   encoder_decoder: bool = False) -> tuple[torch.Tensor, float]:
    """A model's teacher-forced greedy choices on `tokens` `[N, T]` (`forward(input_ids) -> logits`, e.g.
    `window_logits`): the argmax ids at every predicted position and the mean NLL of the real tokens there
    (nats/token). Batch by batch, so the full log-probabilities `[N, T-1, V]` are never held."""
    choices, total = [], 0.0
    for start in range(0, tokens.shape[0], batch_size):
        batch = tokens[start : start + batch_size]
        logp = log_probs(forward, batch, vocab_size, batch_size)
        choices.append(logp.argmax(-1))
        total -= logp.gather(-1, window_targets(batch, encoder_decoder)[..., None].cpu()).sum().item()
    argmax = torch.cat(choices)
    return argmax, total / argmax.numel()
