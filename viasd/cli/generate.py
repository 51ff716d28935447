"""`viasd generate`: decode one prompt with any method, with models given on the command line (a directory
or a hub id) or as one cell of the study (`--pair P --task T --run R`: the pair's models, the run's slim,
the policy the study decodes that cell with, tuned thresholds and learned router included)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict, fields, replace
from pathlib import Path

from ..decoding.policy import CACHE_KINDS, ROUTERS, DecodePolicy
from ..decoding.processors import ProcessorSettings, resolve
from ..decoding.sampling import SamplingConfig
from ..errors import ViasdError
from .common import add_generation_args, grid_cells

log = logging.getLogger(__name__)

DEFAULTS = {f.name: f.default for f in fields(DecodePolicy)} | asdict(SamplingConfig())
# what a study cell takes from its pair and run; given with --pair, these are an error
MODEL_FLAGS = {"target": "--target", "draft": "--draft", "draft_layers": "--draft-layers", "mask": "--mask",
               "keep_layers": "--keep-layers",
               "independent": "--independent", "router_file": "--router-file", "method": "--method",
               "trust_remote_code": "--trust-remote-code", "dtype": "--dtype"}
SAMPLING = ("temperature", "top_k", "top_p")
# the policy options: absent ones keep DecodePolicy's defaults, or with --pair the cell's policy
POLICY_FLAGS = ("gamma", *SAMPLING, "seed", "max_new_tokens", "tau_accept", "tau_slim", "score", "confidence",
                "max_lag", "gate", "verify_lagged", "verify_block", "router", "oracle_budget", "cache", "reuse",
                "compile", "rule", "alpha", "gamma_slim", "draft_stop", "tree_nodes", "tree_top_k",
                "generation_config")


def _float(text: str) -> float:
    try:
        return float(text)  # accepts "inf" to switch a tier off
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _default(name: str) -> str:
    return f" (default: {DEFAULTS[name]})"


def add_generate(sub) -> None:
    p = sub.add_parser("generate", help="decode one prompt with any method and print text + statistics",
                       description="Decode one prompt with any method; print the completion and statistics. Models "
                                   "come from --target/--draft/--mask, or from one cell of the study (--pair, --task, "
                                   "--run), decoded with the policy the study uses for it.")
    _add_models(p)
    _add_policy(p)
    p.add_argument("--device", help="auto, cpu, cuda, cuda:N, mps (default: auto, or with --pair params.yaml's)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", type=Path, help="file holding the prompt text")
    src.add_argument("--prompts-file", type=Path, metavar="FILE.jsonl",
                     help="many prompts decoded as a batch: one per line, a JSON string or an object with a \"prompt\" "
                          "key; one completion (with --json, one JSON object) per prompt, in order")
    p.add_argument("--batch-size", type=int, help="with --prompts-file: at most this many prompts decoded together "
                   "(default: all; a finished prompt's slot takes the next)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: text, token_ids, stats, policy, and the generation settings applied "
                        "(the generation config's with overrides)")
    p.set_defaults(func=_generate)


def _add_models(p) -> None:
    from ..decoding.policy import METHODS

    m = p.add_argument_group("models given directly")
    m.add_argument("--target", help="target model: local directory or Hugging Face hub id")
    m.add_argument("--draft", help="draft model (every method but ar needs one)")
    m.add_argument("--draft-layers", metavar="0,1",
                   help="self-speculation under any drafting method: the target's own layers draft (no --draft); "
                        "under viasd the slim (--keep-layers) must keep more")
    m.add_argument("--mask", action="append", default=[], metavar="FILE",
                   help="routing mask JSON ({\"keep_layers\": [...]}); repeat for the N-tier form (smallest first)")
    m.add_argument("--keep-layers", action="append", default=[], metavar="0,2,5",
                   help="slim verifier layers inline, instead of --mask; may be repeated")
    m.add_argument("--independent", metavar="DIR",
                   help="a separately trained intermediate model, used after any masks (the independent ablation)")
    m.add_argument("--method", choices=METHODS, help="decoding method" + _default("method"))
    m.add_argument("--router-file", type=Path, metavar="FILE", help="the router `viasd train-router` wrote")
    m.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    m.add_argument("--trust-remote-code", action="store_true", help="run model code from the hub (off by default)")
    c = p.add_argument_group("one cell of the study (instead of the models above)")
    c.add_argument("--pair", help="a pair of params.yaml's models (its target, draft and independent model)")
    c.add_argument("--task", help="the task whose tuned thresholds, stop strings and max_new_tokens apply")
    c.add_argument("--run", default="viasd", help="a run of the study grid, e.g. viasd, sd, viasd-mask_random "
                                                  "(default: viasd, with the thresholds tuned for its slim)")
    c.add_argument("--params", type=Path, default=Path("params.yaml"), help="the study's parameter file")
    c.add_argument("--config", type=Path, action="append", default=[], metavar="FILE",
                   help="a file merged over --params (e.g. config/smoke.yaml); may be repeated")


def _add_policy(p) -> None:
    from ..decoding.policy import SPEC_CASCADE_RULES
    from ..decoding.tiers import CONFIDENCES, SCORES

    d = p.add_argument_group("decoding policy (with --pair: overrides of the cell's policy)")
    d.add_argument("--gamma", type=int, help="draft block length" + _default("gamma"))
    d.add_argument("--temperature", type=float, help="0 = greedy" + _default("temperature"))
    d.add_argument("--top-k", type=int, help="0 = off" + _default("top_k"))
    d.add_argument("--top-p", type=float, help="1 = off" + _default("top_p"))
    d.add_argument("--seed", type=int, help="sampling seed" + _default("seed"))
    d.add_argument("--max-new-tokens", type=int, help=_default("max_new_tokens").strip(" ()") +
                   "; with --pair the task's")
    d.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop string; may be repeated (with --pair: besides the task's)")
    d.add_argument("--tau-accept", type=_float, action="append", metavar="X",
                   help="tier-1 threshold (inf = off); repeat once per slim verifier for N tiers")
    d.add_argument("--tau-slim", type=_float, action="append", metavar="Y",
                   help="tier-2 threshold (inf = off); repeat once per slim verifier for N tiers")
    d.add_argument("--score", choices=sorted(SCORES), help="tier-1 score" + _default("score"))
    d.add_argument("--confidence", choices=sorted(CONFIDENCES), help="tier-2 confidence" + _default("confidence"))
    d.add_argument("--max-lag", type=int, help="force a full-model catch-up above this lag (0 = never)")
    d.add_argument("--draft-stop", type=float, metavar="P",
                   help="dynamic draft length: a block's drafting stops after a token the drafter gave a probability "
                        "below P (0 = off, the default: always --gamma tokens)")
    d.add_argument("--tree-nodes", type=int, metavar="N",
                   help="sd: draft a tree of at most N nodes, --gamma deep, verified in one pass (0 = a chain, the "
                        "default)")
    d.add_argument("--tree-top-k", type=int, metavar="K", help="sd's tree: children per expanded node (default 4)")
    d.add_argument("--gate", type=float,
                   help="viasd tier 0: a block whose draft gives one of its tokens p < GATE goes straight to the full "
                        "model (0 = off, the default)")
    d.add_argument("--verify-lagged", action=argparse.BooleanOptionalAction,
                   help="viasd: full-model passes also check the lagged tokens they are fed and roll back at the "
                        "first rejection (default: on)")
    d.add_argument("--verify-block", action="store_true", default=None,
                   help="an escalated block is re-verified by the full model from its first position")
    d.add_argument("--router", choices=ROUTERS,
                   help="who decides viasd's tiers: rules (--score/--confidence against --tau-accept/--tau-slim; the "
                        "default), learned (the taus are then probabilities: P(draft right), P(slim right)) or oracle "
                        "(greedy only: the target's own greedy token, peeked apart; the ceiling of any router)")
    d.add_argument("--oracle-budget", type=float,
                   help="the oracle may settle this share of the output although wrong (default 0: fidelity 1)")
    d.add_argument("--cache", choices=CACHE_KINDS,
                   help="KV cache kind: inplace (default), dynamic (transformers' DynamicCache), static (StaticCache)")
    d.add_argument("--reuse", action=argparse.BooleanOptionalAction,
                   help="viasd: compute the layers the slim shares with the full model once (default: off)")
    d.add_argument("--compile", action="store_true", default=None,
                   help="run the models through torch.compile (pays off over long runs)")
    d.add_argument("--rule", choices=SPEC_CASCADE_RULES, help="spec_cascade deferral rule" + _default("rule"))
    d.add_argument("--alpha", type=float, help="spec_cascade lenience" + _default("alpha"))
    d.add_argument("--gamma-slim", type=int, help="cascade_sd: slim-level tokens per full verification")
    add_generation_args(d)


def _read_prompt(args) -> str:
    if args.prompt_file is not None:
        try:
            prompt = args.prompt_file.read_text()
        except OSError as err:
            raise ViasdError(f"cannot read the prompt file {args.prompt_file}: {err.strerror}") from None
    else:
        prompt = args.prompt
    if not prompt:
        raise ViasdError("the prompt is empty: give some text to continue")
    return prompt


def policy_overrides(args, base: DecodePolicy) -> dict:
    """The `DecodePolicy` fields given on the command line, over `base` (sampling options merged into its
    `SamplingConfig`, stop strings added to its own)."""
    given = {k: getattr(args, k) for k in POLICY_FLAGS if getattr(args, k) is not None}
    for name in ("tau_accept", "tau_slim"):
        if name in given:
            given[name] = given[name][0] if len(given[name]) == 1 else tuple(given[name])
    sampling = {k: given.pop(k) for k in SAMPLING if k in given}
    if sampling:
        given["sampling"] = replace(base.sampling, **sampling)
    if args.stop:
        given["stop_strings"] = tuple(dict.fromkeys(base.stop_strings + tuple(args.stop)))
    if args.generation:
        given["generation"] = ProcessorSettings.parse(dict(args.generation)).over(base.generation)
    return given


def _direct(args):
    """Policy and models from the command line alone."""
    from ..decoding.slim import RoutingMask, num_decoder_layers
    from ..models import load_models

    if not args.target:
        raise ViasdError("give the models: --target DIR (and --draft, --mask ...), or a study cell: --pair P --task T")
    base = DecodePolicy(method=args.method or DEFAULTS["method"])
    policy = replace(base, **policy_overrides(args, base))
    if args.draft_layers and args.draft:
        raise ViasdError("give one drafter: --draft DIR (a draft model) or --draft-layers 0,1 (the target's own layers)")
    if args.draft_layers and policy.needs_draft:
        policy = replace(policy, drafter="self")
    if policy.needs_draft and not (args.draft or args.draft_layers):
        raise ViasdError(f"method {policy.method} needs --draft (or --draft-layers for the target's own layers)")
    if policy.needs_slim and not (args.mask or args.keep_layers or args.independent):
        raise ViasdError(f"method {policy.method} needs a slim verifier: pass --mask FILE or --keep-layers 0,2,...")
    if (policy.router == "learned") != (args.router_file is not None):
        raise ViasdError("--router learned and --router-file FILE go together")
    device = args.device or "auto"
    models = load_models(args.target, draft=args.draft if policy.needs_draft and args.draft else None, device=device,
                         dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    if policy.drafter == "self":
        models.set_self_drafter(RoutingMask.parse(args.draft_layers, num_decoder_layers(models.target)))
    if policy.needs_slim:
        n = num_decoder_layers(models.target)
        for path in args.mask:
            models.add_mask(RoutingMask.from_json(path, n))
        for text in args.keep_layers:
            models.add_mask(RoutingMask.parse(text, n))
        if args.independent:  # after the masks: the independent model is the largest level
            models.add_independent_from(args.independent, device, args.dtype, args.trust_remote_code)
    if args.router_file is not None:
        from ..training.tier_router import load_router

        models.router = load_router(args.router_file)
    return policy, models


def _study_cell(args):
    """Policy and models of one study cell (`study.cells.GridCell`), with the command line's overrides."""
    from ..study.cells import GridCell, study_policy

    given = [flag for dest, flag in MODEL_FLAGS.items() if getattr(args, dest) not in (None, [], False, "auto")]
    if given:
        raise ViasdError(f"{', '.join(given)}: with --pair the models, slim and method come from the study "
                         "(params.yaml's pair and --run)")
    if not args.task:
        raise ViasdError("--pair needs --task: the task whose tuned thresholds and stop strings apply")
    params, pair, (run,) = grid_cells(args, [args.run])
    cell = GridCell.of(params, pair.name, args.task, run)
    base = study_policy(cell)
    overrides = policy_overrides(args, base)
    if overrides:
        log.info("the study's policy for %s/%s/%s, with %s from the command line", cell.pair, cell.task,
                 cell.run.name, ", ".join(sorted(overrides)))
    policy = replace(base, **overrides)
    return policy, cell.load_models(policy, args.device)


def _read_prompts(path: Path) -> list[str]:
    """The prompts of a JSON-lines file: each line a JSON string or an object with a "prompt" key."""
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except OSError as err:
        raise ViasdError(f"cannot read the prompts file {path}: {err.strerror}") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            raise ViasdError(f"{path}:{n}: not JSON; give one JSON string or {{\"prompt\": ...}} per line") from None
        prompt = item.get("prompt") if isinstance(item, dict) else item
        if not isinstance(prompt, str) or not prompt:
            raise ViasdError(f"{path}:{n}: no prompt text (a non-empty JSON string, or an object with a \"prompt\" key)")
        prompts.append(prompt)
    if not prompts:
        raise ViasdError(f"{path} holds no prompt")
    return prompts


def _generate(args) -> int:
    if args.batch_size is not None and (args.prompts_file is None or args.batch_size < 1):
        raise ViasdError("--batch-size takes a number of at least 1, with --prompts-file")
    prompts = _read_prompts(args.prompts_file) if args.prompts_file is not None else [_read_prompt(args)]
    policy, models = _study_cell(args) if args.pair else _direct(args)
    if args.prompts_file is not None:
        results = models.generate(prompts, policy, batch_size=args.batch_size)
    else:
        results = [models.generate(prompts[0], policy)]
    applied = resolve(models.target, policy.generation_config, policy.generation, policy.sampling.greedy)
    for result in results:
        if args.json:
            print(json.dumps({"text": result.text, "token_ids": result.token_ids, "stats": result.stats.as_dict(),
                              "policy": policy.as_record(), "generation": applied.as_dict()}))
        else:
            print(result.text)
            print("---", file=sys.stderr)
            print(result.stats.summary(), file=sys.stderr)
    return 0
