"""Fitting the learned router (`decoding.router.LearnedRouter`), its held-out quality, and its file.

Data: the rows `decoding.router.RouterRows` collects from oracle decodes (docs/method.md, "The router").
An oracle decode emits exactly the target's greedy output and sees, at every block row it decides on,
what a routed decode sees there: the draft's block drafted on the target's own prefix. So the rows are
on-policy for the decisions the router makes, with labels for free, which teacher-forced windows of
real text are not (real text is harder than the target's own continuation, and has no blocks).

Model: two L2-regularised logistic regressions (`P(x_i = t_i)`, `P(argmax q'_i = t_i)`) over the
standardised features and, with a probe, the shared trunk's hidden state. Fitted with `torch`
(full-batch L-BFGS on the convex loss): the router then runs in the decode loop as the same tensor ops,
with no second numerical library, and torch is already what every model here runs on. Logistic
regression fitted by maximum likelihood is calibrated where its form holds; the held-out ECE and the
reliability curve say how far that is true.

Held out: whole decodes (prompts), `holdout` of them, chosen by a seeded permutation; the shipped router
is the one fitted without them, so its reported AUC and ECE are its own.

Model selection (`fit_router` with more than one candidate): whether the probe is used, and each head's L2
penalty, are chosen on validation decodes (a further `holdout` share of the training decodes, never the
held-out ones) by mean log-loss, a proper scoring rule (it rewards ranking and calibration alike); the
chosen setting is then refitted on every training decode. A probe's hidden dimensions can over-fit a few
thousand rows, and then the choice drops it (docs/method.md, "The router: who decides the tiers").
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from ..decoding.tier_router import FEATURES, LearnedRouter, LogisticHead
from ..errors import ViasdError
from ..io import write_text

log = logging.getLogger(__name__)

FORMAT = 1


def _fit_logistic(z: torch.Tensor, y: torch.Tensor, l2: float, max_iter: int = 200) -> LogisticHead:
    """Minimise mean BCE + `l2` * |w|^2 over standardised `z` `[n, D]`, labels `y` `[n]` in {0, 1}."""
    mean = z.mean(0)
    scale = z.std(0).clamp_min(1e-6)
    zs = (z - mean) / scale
    w = torch.zeros(z.shape[1], dtype=torch.float64, requires_grad=True)
    rate = float(y.mean().clamp(1e-4, 1 - 1e-4))
    b = torch.tensor(math.log(rate / (1 - rate)), dtype=torch.float64, requires_grad=True)
    zs, y = zs.double(), y.double()
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(zs @ w + b, y) + l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return LogisticHead(mean.float(), scale.float(), w.detach().float(), float(b.detach()))


def _constant_head(z: torch.Tensor, y: torch.Tensor) -> LogisticHead:
    """The head of labels `y` `[n]` that hold one class only (a drafter the target agreed with on every training
    row): no feature can separate them, so every row gets the smoothed rate `(k + 1) / (n + 2)` (Laplace's rule
    of succession: `k` ones of `n`), a calibrated constant rather than a logistic fit's unbounded bias."""
    rate = (float(y.sum()) + 1) / (len(y) + 2)
    return LogisticHead(z.mean(0).float(), z.std(0).clamp_min(1e-6).float(), torch.zeros(z.shape[1]),
                        math.log(rate / (1 - rate)))


def auc(y: torch.Tensor, s: torch.Tensor) -> float | None:
    """Area under the ROC curve (Mann-Whitney, tied scores share their average rank); None if one class is absent."""
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    if not n_pos or not n_neg:
        return None
    _, inverse, counts = torch.unique(s, return_inverse=True, return_counts=True)
    upper = torch.cumsum(counts, 0).double()  # ranks of each distinct value: (upper - count + 1 .. upper)
    ranks = (upper - (counts.double() - 1) / 2)[inverse]
    return float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def reliability(y: torch.Tensor, prob: torch.Tensor, bins: int = 10) -> tuple[float, list[dict]]:
    """Expected calibration error over `bins` equal-width bins, and the bins (mean predicted, observed, count)."""
    edges = torch.linspace(0, 1, bins + 1)
    which = torch.bucketize(prob.clamp(0, 1 - 1e-9), edges[1:-1], right=True)  # bins [lo, hi)
    ece, rows = 0.0, []
    for b in range(bins):
        sel = which == b
        n = int(sel.sum())
        if not n:
            continue
        predicted, observed = float(prob[sel].mean()), float(y[sel].float().mean())
        ece += n / len(y) * abs(predicted - observed)
        rows.append({"lo": float(edges[b]), "hi": float(edges[b + 1]), "predicted": predicted, "observed": observed, "n": n})
    return ece, rows


def heldout_rows(groups: torch.Tensor, share: float, seed: int) -> torch.Tensor:
    """`[N]` bool: the rows of a seeded `share` of the decodes (at least one decode when there are two or more)."""
    ids = torch.unique(groups)
    n = min(max(1, round(share * len(ids))), len(ids) - 1) if len(ids) > 1 else 0
    order = ids[torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed))]
    return torch.isin(groups, order[:n])


def log_loss(y: torch.Tensor, prob: torch.Tensor) -> float:
    """Mean binary cross-entropy of probabilities `prob` for labels `y` (both `[n]`)."""
    return float(torch.nn.functional.binary_cross_entropy(prob.double().clamp(1e-7, 1 - 1e-7), y.double()))


def _inputs(rows: dict[str, torch.Tensor], probe_layers: int) -> torch.Tensor:
    """`[N, F (+ H)]`: the rows' features, and their hidden states when the probe is used."""
    features = rows["features"].float()
    return torch.cat([features, rows["hidden"].float()], dim=-1) if probe_layers else features


def _select(rows: dict[str, torch.Tensor], train: torch.Tensor, probes: Sequence[int], l2s: Sequence[float],
            share: float, seed: int) -> tuple[int, dict[str, float], list[dict]]:
    """Choose the probe (one for both heads) and each head's L2 by mean log-loss on validation decodes (a
    seeded `share` of the training decodes, `train` `[N]` bool); returns `(probe_layers, {head: l2}, trace)`."""
    inner = torch.zeros_like(train)
    inner[train] = heldout_rows(rows["group"][train], share, seed + 1)
    fit = train & ~inner
    trace, best = [], {}
    for probe in probes:
        z = _inputs(rows, probe)
        for name, labels in (("draft", rows["draft_right"]), ("slim", rows["slim_right"])):
            known = ~torch.isnan(labels)
            on, val = known & fit, known & inner
            if labels[on].unique().numel() < 2 or labels[val].unique().numel() < 2:
                raise ViasdError(f"the router's {name}-right labels have one class in its fit or validation decodes: "
                                 "decode more calibration prompts (router.prompts) or fix router.probe and router.l2")
            for l2 in l2s:
                prob = _fit_logistic(z[on], labels[on], l2)(z[val])
                row = {"probe_layers": probe, "head": name, "l2": l2, "validation_log_loss": log_loss(labels[val], prob),
                       "validation_auc": auc(labels[val], prob)}
                trace.append(row)
                if (probe, name) not in best or row["validation_log_loss"] < best[probe, name]["validation_log_loss"]:
                    best[probe, name] = row
    loss = {probe: best[probe, "draft"]["validation_log_loss"] + best[probe, "slim"]["validation_log_loss"]
            for probe in probes}
    probe = min(probes, key=lambda p: (loss[p], p))  # ties: the smaller input
    return probe, {name: best[probe, name]["l2"] for name in ("draft", "slim")}, trace


def fit_router(rows: dict[str, torch.Tensor], probe_layers: int | Sequence[int] = 0,
               l2: float | Sequence[float] = 1e-3, holdout: float = 0.25, seed: int = 0) -> LearnedRouter:
    """Fit both heads on `RouterRows.tensors()` and evaluate them on the held-out decodes; `info` holds the figures.

    `probe_layers`: the probe to use (`> 0`: the rows' `hidden` is its input), or several to choose from (e.g.
    `(0, 6)`: with or without it); `l2`: the penalty, or several to choose from per head. With more than one
    candidate the choice is made on validation decodes (`_select`) and recorded in `info["selection"]`."""
    probes = tuple(dict.fromkeys([probe_layers] if isinstance(probe_layers, int) else probe_layers))
    l2s = tuple(dict.fromkeys([l2] if isinstance(l2, int | float) else l2))
    features, hidden = rows["features"].float(), rows["hidden"].float()
    if len(features) < 50:
        raise ViasdError(f"only {len(features)} router rows: decode more calibration prompts to fit a router")
    if any(probes) and hidden.shape[1] == 0:
        raise ViasdError("a probe needs the shared trunk's hidden states, and these rows have none "
                         "(collect them with decode.reuse on and a mask that keeps layer 0)")
    test = heldout_rows(rows["group"], holdout, seed)
    selection = []
    if len(probes) * len(l2s) > 1:
        probe, head_l2, selection = _select(rows, ~test, probes, l2s, holdout, seed)
    else:
        probe, head_l2 = probes[0], {"draft": l2s[0], "slim": l2s[0]}
    z = _inputs(rows, probe)
    info = {"rows": len(z), "heldout_rows": int(test.sum()), "decodes": int(torch.unique(rows["group"]).numel()),
            "probe_layers": probe, "probe_dims": hidden.shape[1] if probe else 0, "l2": head_l2,
            "selection": selection}
    heads = {}
    for name, labels in (("draft", rows["draft_right"]), ("slim", rows["slim_right"])):
        known = ~torch.isnan(labels)
        train, held = known & ~test, known & test
        if not int(train.sum()):
            raise ViasdError(f"the router's {name}-right labels are all unknown: nothing to learn")
        if labels[train].unique().numel() < 2:
            log.warning("the router's %s-right labels are all %d on its training rows: its head is their smoothed "
                        "rate, the same for every row", name, int(labels[train][0]))
            head = _constant_head(z[train], labels[train])
        else:
            head = _fit_logistic(z[train], labels[train], head_l2[name])
        heads[name] = head
        prob = head(z[held]) if int(held.sum()) else torch.zeros(0)
        ece, bins = reliability(labels[held], prob) if len(prob) else (None, [])
        info[name] = {"train_rows": int(train.sum()), "heldout_rows": int(held.sum()), "l2": head_l2[name],
                      "base_rate": float(labels[known].mean()), "auc": auc(labels[held], prob) if len(prob) else None,
                      "log_loss": log_loss(labels[held], prob) if len(prob) else None, "ece": ece, "reliability": bins,
                      "weights": {f: float(w) for f, w in zip(FEATURES, head.weight[: len(FEATURES)])}}
    return LearnedRouter(heads["draft"], heads["slim"], probe, FEATURES, info)


def save_router(router: LearnedRouter, path: Path) -> None:
    """One JSON file (weights as lists: a few hundred numbers), written atomically."""
    heads = {name: {"mean": h.mean.tolist(), "scale": h.scale.tolist(), "weight": h.weight.tolist(), "bias": h.bias}
             for name, h in (("draft", router.draft), ("slim", router.slim))}
    data = {"format": FORMAT, "features": list(router.features), "probe_layers": router.probe_layers,
            "heads": heads, "info": router.info}
    write_text(Path(path), json.dumps(data, indent=1, sort_keys=True) + "\n")


def load_router(path: Path) -> LearnedRouter:
    """The router saved by `save_router`; one clear error for a missing, unreadable or foreign file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ViasdError(f"no router at {path}: run `viasd train-router` for this pair first") from None
    except (OSError, json.JSONDecodeError) as err:
        raise ViasdError(f"cannot read the router {path}: {err}") from None
    if data.get("format") != FORMAT or tuple(data.get("features", ())) != FEATURES:
        raise ViasdError(f"{path} was written for other router features ({data.get('features')}); fit it again "
                         "with `viasd train-router`")

    def head(h):
        return LogisticHead(*(torch.tensor(h[k], dtype=torch.float32) for k in ("mean", "scale", "weight")), float(h["bias"]))

    return LearnedRouter(head(data["heads"]["draft"]), head(data["heads"]["slim"]), int(data["probe_layers"]),
                         FEATURES, data.get("info", {}))
