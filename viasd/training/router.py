"""Fitting the learned router (`decoding.router.LearnedRouter`), its held-out quality, and its file.

Data: the rows `decoding.router.RouterRows` collects from oracle decodes (docs/method.md, "The router").
An oracle decode emits exactly the target's greedy output and sees, at every block row it decides on,
what a routed decode sees there: the draft's block drafted on the target's own prefix. So the rows are
on-policy for the decisions the router makes, with labels for free, which teacher-forced windows of
real text are not (real text is harder than the target's own continuation, and has no blocks).

Model: two heads (`P(x_i = t_i)`, `P(argmax q'_i = t_i)`) over the standardised features and, with a probe,
the shared trunk's hidden state: each an L2-regularised logistic regression or, with `units > 0`, one
with a hidden ReLU layer of that width (interactions a linear score cannot weigh, at a few hundred more
weights). Fitted with `torch` (full-batch L-BFGS; convex for the logistic regression, from a seeded
initialisation for the hidden layer): the router then runs in the decode loop as the same tensor ops,
with no second numerical library, and torch is already what every model here runs on. A head fitted by
maximum likelihood is calibrated where its form holds; the held-out ECE and the reliability curve say how
far that is true.

Held out: whole decodes (prompts), `holdout` of them, chosen by a seeded permutation; the shipped router
is the one fitted without them, so its reported AUC and ECE are its own.

Model selection (`fit_router` with more than one candidate): whether the probe is used, and each head's
hidden units and L2 penalty, are chosen on validation decodes (a further `holdout` share of the training decodes, never the
held-out ones) by mean log-loss, a proper scoring rule (it rewards ranking and calibration alike); the
chosen setting is then refitted on every training decode. On the default family the probe's 256 hidden
dimensions over-fit a few thousand rows and the choice drops it (measured in docs/method.md, "Fitting it").
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from ..decoding.router import FEATURES, LearnedRouter, RouterHead
from ..errors import ViasdError
from ..io import write_text

FORMAT = 1


def _fit_head(z: torch.Tensor, y: torch.Tensor, l2: float, units: int = 0, seed: int = 0,
              max_iter: int | None = None) -> RouterHead:
    """Minimise mean BCE + `l2` * |weights|^2 over standardised `z` `[n, D]`, labels `y` `[n]` in {0, 1}.

    `units` 0: logistic regression (convex; from zero weights). `units` U > 0: one hidden ReLU layer of U
    units (not convex: He-initialised from `seed`, so a fit is deterministic); the penalty covers both
    layers' weights, not the biases. Full-batch L-BFGS with a strong-Wolfe line search either way."""
    mean = z.mean(0)
    scale = z.std(0).clamp_min(1e-6)
    zs, y = ((z - mean) / scale).double(), y.double()
    d = z.shape[1]
    rate = float(y.mean().clamp(1e-4, 1 - 1e-4))
    b = torch.tensor(math.log(rate / (1 - rate)), dtype=torch.float64, requires_grad=True)
    if units:
        gen = torch.Generator().manual_seed(seed)
        w1 = (torch.randn(d, units, generator=gen, dtype=torch.float64) * math.sqrt(2 / d)).requires_grad_()
        b1 = torch.zeros(units, dtype=torch.float64, requires_grad=True)
        w = (torch.randn(units, generator=gen, dtype=torch.float64) / math.sqrt(units)).requires_grad_()
        weights = [w1, w]
        tensors = [w1, b1, w, b]

        def logits():
            return torch.relu(zs @ w1 + b1) @ w + b
    else:
        w = torch.zeros(d, dtype=torch.float64, requires_grad=True)
        weights, tensors = [w], [w, b]

        def logits():
            return zs @ w + b
    opt = torch.optim.LBFGS(tensors, lr=1.0, max_iter=max_iter or (400 if units else 200),
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits(), y) + l2 * sum((t * t).sum() for t in weights)
        loss.backward()
        return loss

    opt.step(closure)
    if units:
        return RouterHead(mean.float(), scale.float(), w.detach().float(), float(b.detach()), w1.detach().float(),
                          b1.detach().float())
    return RouterHead(mean.float(), scale.float(), w.detach().float(), float(b.detach()))


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


def _candidates(value, kind) -> tuple:
    """A setting given as one value or a list of values to choose from, as a tuple without repeats."""
    return tuple(dict.fromkeys([value] if isinstance(value, kind) else value))


def _select(rows: dict[str, torch.Tensor], train: torch.Tensor, probes: Sequence[int], units: Sequence[int],
            l2s: Sequence[float], share: float, seed: int) -> tuple[int, dict[str, dict], list[dict]]:
    """Choose the probe (one for both heads) and each head's hidden units and L2 by mean log-loss on validation
    decodes (a seeded `share` of the training decodes, `train` `[N]` bool); returns `(probe_layers, {head:
    {"units": U, "l2": l2}}, trace)`."""
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
                                 "decode more calibration prompts (router.prompts) or fix router.probe, router.units "
                                 "and router.l2")
            for width in units:
                for l2 in l2s:
                    prob = _fit_head(z[on], labels[on], l2, width, seed)(z[val])
                    row = {"probe_layers": probe, "head": name, "units": width, "l2": l2,
                           "validation_log_loss": log_loss(labels[val], prob), "validation_auc": auc(labels[val], prob)}
                    trace.append(row)
                    # ties: the first (smaller) candidate, as listed
                    if (probe, name) not in best or row["validation_log_loss"] < best[probe, name]["validation_log_loss"]:
                        best[probe, name] = row
    loss = {probe: best[probe, "draft"]["validation_log_loss"] + best[probe, "slim"]["validation_log_loss"]
            for probe in probes}
    probe = min(probes, key=lambda p: (loss[p], p))  # ties: the smaller input
    return probe, {name: {k: best[probe, name][k] for k in ("units", "l2")} for name in ("draft", "slim")}, trace


def fit_router(rows: dict[str, torch.Tensor], probe_layers: int | Sequence[int] = 0,
               l2: float | Sequence[float] = 1e-3, holdout: float = 0.25, seed: int = 0,
               units: int | Sequence[int] = 0) -> LearnedRouter:
    """Fit both heads on `RouterRows.tensors()` and evaluate them on the held-out decodes; `info` holds the figures.

    `probe_layers`: the probe to use (`> 0`: the rows' `hidden` is its input), or several to choose from (e.g.
    `(0, 6)`: with or without it); `units`: each head's hidden layer (0: logistic regression), or several to
    choose from per head; `l2`: the penalty, or several to choose from per head. With more than one candidate
    the choice is made on validation decodes (`_select`) and recorded in `info["selection"]`."""
    probes, widths, l2s = _candidates(probe_layers, int), _candidates(units, int), _candidates(l2, int | float)
    if any(w < 0 for w in widths):
        raise ViasdError(f"router units must be >= 0 (0: logistic regression), got {list(widths)}")
    features, hidden = rows["features"].float(), rows["hidden"].float()
    if len(features) < 50:
        raise ViasdError(f"only {len(features)} router rows: decode more calibration prompts to fit a router")
    if any(probes) and hidden.shape[1] == 0:
        raise ViasdError("a probe needs the shared trunk's hidden states, and these rows have none "
                         "(collect them with decode.reuse on and a mask that keeps layer 0)")
    test = heldout_rows(rows["group"], holdout, seed)
    selection = []
    if len(probes) * len(widths) * len(l2s) > 1:
        probe, setting, selection = _select(rows, ~test, probes, widths, l2s, holdout, seed)
    else:
        probe, setting = probes[0], {name: {"units": widths[0], "l2": l2s[0]} for name in ("draft", "slim")}
    z = _inputs(rows, probe)
    info = {"rows": len(z), "heldout_rows": int(test.sum()), "decodes": int(torch.unique(rows["group"]).numel()),
            "probe_layers": probe, "probe_dims": hidden.shape[1] if probe else 0,
            "l2": {name: setting[name]["l2"] for name in setting},
            "units": {name: setting[name]["units"] for name in setting}, "selection": selection}
    heads = {}
    for name, labels in (("draft", rows["draft_right"]), ("slim", rows["slim_right"])):
        known = ~torch.isnan(labels)
        train, held = known & ~test, known & test
        if labels[train].unique().numel() < 2:
            raise ViasdError(f"the router's {name}-right labels are all {int(labels[train][0])}: nothing to learn")
        head = _fit_head(z[train], labels[train], setting[name]["l2"], setting[name]["units"], seed)
        heads[name] = head
        prob = head(z[held]) if int(held.sum()) else torch.zeros(0)
        ece, bins = reliability(labels[held], prob) if len(prob) else (None, [])
        info[name] = {"train_rows": int(train.sum()), "heldout_rows": int(held.sum()), "l2": setting[name]["l2"],
                      "units": head.units, "base_rate": float(labels[known].mean()),
                      "auc": auc(labels[held], prob) if len(prob) else None,
                      "log_loss": log_loss(labels[held], prob) if len(prob) else None, "ece": ece, "reliability": bins,
                      # a linear head's weight per (standardised) feature; a hidden layer's weights are not per feature
                      "weights": {} if head.units else
                      {f: float(w) for f, w in zip(FEATURES, head.weight[: len(FEATURES)])}}
    return LearnedRouter(heads["draft"], heads["slim"], probe, FEATURES, info)


def save_router(router: LearnedRouter, path: Path) -> None:
    """One JSON file (weights as lists: a few hundred numbers), written atomically."""
    heads = {name: {"mean": h.mean.tolist(), "scale": h.scale.tolist(), "weight": h.weight.tolist(), "bias": h.bias,
                    **({"hidden_weight": h.hidden_weight.tolist(), "hidden_bias": h.hidden_bias.tolist()} if h.units else {})}
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
        hidden = [torch.tensor(h[k], dtype=torch.float32) for k in ("hidden_weight", "hidden_bias") if k in h]
        return RouterHead(*(torch.tensor(h[k], dtype=torch.float32) for k in ("mean", "scale", "weight")), float(h["bias"]),
                          *hidden)

    return LearnedRouter(head(data["heads"]["draft"]), head(data["heads"]["slim"]), int(data["probe_layers"]),
                         FEATURES, data.get("info", {}))
