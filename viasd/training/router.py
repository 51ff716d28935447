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
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ..decoding.router import FEATURES, LearnedRouter, LogisticHead
from ..errors import ViasdError
from ..io import write_text

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


def fit_router(rows: dict[str, torch.Tensor], probe_layers: int = 0, l2: float = 1e-3, holdout: float = 0.25,
               seed: int = 0) -> LearnedRouter:
    """Fit both heads on `RouterRows.tensors()` (`probe_layers` > 0: the rows' `hidden` is the probe's input),
    evaluate them on the held-out decodes; `info` holds the figures."""
    features, hidden = rows["features"].float(), rows["hidden"].float()
    if len(features) < 50:
        raise ViasdError(f"only {len(features)} router rows: decode more calibration prompts to fit a router")
    if probe_layers and hidden.shape[1] == 0:
        raise ViasdError("a probe needs the shared trunk's hidden states, and these rows have none "
                         "(collect them with decode.reuse on and a mask that keeps layer 0)")
    z = torch.cat([features, hidden], dim=-1) if probe_layers else features
    test = heldout_rows(rows["group"], holdout, seed)
    info = {"rows": len(z), "heldout_rows": int(test.sum()), "decodes": int(torch.unique(rows["group"]).numel()),
            "probe_layers": probe_layers, "probe_dims": hidden.shape[1] if probe_layers else 0, "l2": l2}
    heads = {}
    for name, labels in (("draft", rows["draft_right"]), ("slim", rows["slim_right"])):
        known = ~torch.isnan(labels)
        train, held = known & ~test, known & test
        if labels[train].unique().numel() < 2:
            raise ViasdError(f"the router's {name}-right labels are all {int(labels[train][0])}: nothing to learn")
        head = _fit_logistic(z[train], labels[train], l2)
        heads[name] = head
        prob = head(z[held]) if int(held.sum()) else torch.zeros(0)
        ece, bins = reliability(labels[held], prob) if len(prob) else (None, [])
        info[name] = {"train_rows": int(train.sum()), "heldout_rows": int(held.sum()),
                      "base_rate": float(labels[known].mean()), "auc": auc(labels[held], prob) if len(prob) else None,
                      "ece": ece, "reliability": bins,
                      "weights": {f: float(w) for f, w in zip(FEATURES, head.weight[: len(FEATURES)])}}
    return LearnedRouter(heads["draft"], heads["slim"], probe_layers, FEATURES, info)


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
