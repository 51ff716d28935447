"""The report's table of a pair's models and slims (shape, parameters, training, test NLL, greedy agreement with
the target, DIMR cost) and its learned router's summary."""

from __future__ import annotations

import json
from pathlib import Path

from ..config import Params
from ..errors import StudyInputError
from ..study.paths import mask_paths, router_paths
from .tables import markdown

FAMILY_COLUMNS = (("model", "model"), ("shape", "layers × hidden"), ("parameters", "parameters"),
                  ("train_tokens", "training tokens"), ("train_seconds", "training s"),
                  ("steps_per_second", "training steps/s"), ("precision", "training precision"), ("test_nll", "test NLL"),
                  ("nll_vs_target", "NLL − target's"), ("agreement", "greedy agreement with target"),
                  ("dimr_cost", "DIMR cost"))


def family_rows(params: Params, pair: str) -> list[dict]:
    """The pair's models (training reports of the trained family) and slims (kept layers, DIMR cost),
    each with its teacher-forced greedy agreement with the target (measured by `viasd dimr-search`)."""

    spec = params.pair(pair)
    paths = mask_paths(params, pair)
    if not paths["mask"].exists():
        raise StudyInputError(f"no DIMR mask {paths['mask']}: run `viasd dimr-search --pair {pair}` first")
    mask = json.loads(paths["mask"].read_text())
    agreement = mask.get("agreement") or {}  # keyed by role, "slim" and baseline name
    base = (agreement.get("target") or {}).get("nll")

    def row(label: str, key: str, **fields) -> dict:
        measured = agreement.get(key) or {}
        nll = measured.get("nll")
        return {"model": label, **dict.fromkeys(("shape", "parameters", "train_tokens", "train_seconds",
                                                 "steps_per_second", "precision", "test_nll", "dimr_cost")), **fields,
                "agreement": measured.get("agreement"),
                "nll_vs_target": None if nll is None or base is None else round(nll - base, 4)}

    rows = []
    for role in ("target", "draft", "independent"):
        source = getattr(spec, role)
        if source is None:
            continue
        fields = {}
        if (Path(source) / "training.json").exists():
            t = json.loads((Path(source) / "training.json").read_text())
            fields = {"parameters": t["parameters"], "train_tokens": t["tokens"], "train_seconds": t["train_seconds"],
                      "steps_per_second": round(t["steps"] / t["train_seconds"], 2) if t["train_seconds"] else None,
                      "precision": t.get("precision", "float32"), "test_nll": t["test_nll"]}
        if (Path(source) / "config.json").exists():
            c = json.loads((Path(source) / "config.json").read_text())
            if c.get("is_encoder_decoder"):  # T5: num_decoder_layers, d_model; BART: decoder_layers, d_model
                depth = c.get("num_decoder_layers") or c.get("decoder_layers")
                fields["shape"] = f"decoder {depth} × {c.get('d_model')}"
            else:
                fields["shape"] = f"{c.get('num_hidden_layers')} × {c.get('hidden_size')}"
        rows.append(row(role, role, **fields))
    n = mask.get("num_layers")
    slims = [("DIMR", "slim", mask)] + [(b, b, json.loads(paths[b].read_text()))
                                         for b in ("random", "truncate", "every_other") if paths[b].exists()]
    for label, key, m in slims:
        rows.append(row(f"slim ({label})", key, dimr_cost=m.get("cost"),
                        shape=f"{len(m['keep_layers'])} of {n}: {' '.join(map(str, m['keep_layers']))}"))
    return rows


def family_table(rows: list[dict]) -> str:
    return markdown(rows, FAMILY_COLUMNS)


def router_summary(params: Params, pair: str) -> str:
    """The pair's learned router: held-out AUC and ECE of both heads, and its reliability plot."""
    path = router_paths(params, pair)["router"]
    if not path.exists():
        return f"`{pair}` has no learned router (`viasd train-router`).\n"
    info = json.loads(path.read_text())["info"]

    def head(name):
        h = info[name]
        auc = "–" if h["auc"] is None else f"{h['auc']:.3f}"
        ece = "–" if h["ece"] is None else f"{h['ece']:.3f}"
        return f"P({name} right): held-out AUC {auc}, ECE {ece} (base rate {h['base_rate']:.3f})"

    return (f"The learned router of `{pair}` ({info['rows']} rows from {info['decodes']} oracle decodes of the "
            f"calibration set, {info['heldout_rows']} held out; probe after layer {info['probe_layers'] - 1}): "
            f"{head('draft')}; {head('slim')}. ![reliability](router/{pair}/reliability.png)\n"
            if info.get("probe_layers") else
            f"The learned router of `{pair}` ({info['rows']} rows, {info['heldout_rows']} held out, no probe): "
            f"{head('draft')}; {head('slim')}. ![reliability](router/{pair}/reliability.png)\n")
