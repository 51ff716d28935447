"""`viasd generate`: decode one prompt with any method (models from a directory or the hub)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..decoding.policy import CACHE_KINDS, DEFAULT_CACHE, ROUTERS
from ..errors import ViasdError


def _float(text: str) -> float:
    try:
        return float(text)  # accepts "inf" to switch a tier off
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None



def add_generate(sub) -> None:
    from ..decoding.policy import METHODS, SPEC_CASCADE_RULES
    from ..decoding.tiers import CONFIDENCES, SCORES

    p = sub.add_parser("generate", help="decode one prompt with any method and print text + statistics",
                       description="Decode one prompt with any method; print the completion and statistics.")
    p.add_argument("--target", required=True, help="target model: local directory or Hugging Face hub id")
    p.add_argument("--draft", help="draft model (every method but ar needs one)")
    p.add_argument("--mask", action="append", default=[], metavar="FILE",
                   help="routing mask JSON ({\"keep_layers\": [...]}); repeat for the N-tier form (smallest first)")
    p.add_argument("--keep-layers", action="append", default=[], metavar="0,2,5",
                   help="slim verifier layers inline, instead of --mask; may be repeated")
    p.add_argument("--independent", metavar="DIR",
                   help="a separately trained intermediate model, used after any masks (the independent ablation)")
    p.add_argument("--method", default="viasd", choices=METHODS)
    p.add_argument("--gamma", type=int, default=4, help="draft block length")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string; may be repeated")
    p.add_argument("--tau-accept", type=_float, action="append", metavar="X",
                   help="tier-1 threshold (inf = off); repeat once per slim verifier for N tiers")
    p.add_argument("--tau-slim", type=_float, action="append", metavar="Y",
                   help="tier-2 threshold (inf = off); repeat once per slim verifier for N tiers")
    p.add_argument("--score", default="ratio", choices=sorted(SCORES))
    p.add_argument("--confidence", default="max_prob", choices=sorted(CONFIDENCES))
    p.add_argument("--max-lag", type=int, default=0, help="force a full-model catch-up above this lag (0 = never)")
    p.add_argument("--gate", type=float, default=0.0,
                   help="viasd tier 0: a block whose draft gives one of its tokens p < GATE goes straight to the full "
                        "model (0 = off)")
    p.add_argument("--verify-lagged", action=argparse.BooleanOptionalAction, default=True,
                   help="viasd: full-model passes also check the lagged tokens they are fed and roll back at the "
                        "first rejection (default: on)")
    p.add_argument("--verify-block", action="store_true",
                   help="an escalated block is re-verified by the full model from its first position")
    p.add_argument("--router", default="rules", choices=ROUTERS,
                   help="who decides viasd's tiers: rules (--score/--confidence against --tau-accept/--tau-slim), "
                        "learned (--router-file; the taus are then probabilities: P(draft right), P(slim right)) or "
                        "oracle (greedy only: the target's own greedy token, peeked apart; the ceiling of any router)")
    p.add_argument("--router-file", type=Path, metavar="FILE", help="the router `viasd train-router` wrote")
    p.add_argument("--oracle-budget", type=float, default=0.0,
                   help="the oracle may settle this share of the output although wrong (default 0: fidelity 1)")
    p.add_argument("--cache", default=DEFAULT_CACHE, choices=CACHE_KINDS,
                   help="KV cache kind: inplace (default), dynamic (transformers' DynamicCache), static (StaticCache)")
    p.add_argument("--reuse", action=argparse.BooleanOptionalAction, default=False,
                   help="viasd: compute the layers the slim shares with the full model once (default: off)")
    p.add_argument("--compile", action="store_true", help="run the models through torch.compile (pays off over long runs)")
    p.add_argument("--rule", default="opt", choices=SPEC_CASCADE_RULES, help="spec_cascade deferral rule")
    p.add_argument("--alpha", type=float, default=0.1, help="spec_cascade lenience")
    p.add_argument("--gamma-slim", type=int, help="cascade_sd: slim-level tokens per full verification")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N, mps")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--trust-remote-code", action="store_true", help="run model code from the hub (off by default)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", type=Path, help="file holding the prompt text")
    p.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    p.set_defaults(func=_generate)



def _generate(args) -> int:
    from ..decoding.policy import DecodePolicy
    from ..decoding.routing import RoutingMask, num_decoder_layers
    from ..decoding.sampling import SamplingConfig
    from ..models import load_models

    if args.prompt_file is not None:
        try:
            prompt = args.prompt_file.read_text()
        except OSError as err:
            raise ViasdError(f"cannot read the prompt file {args.prompt_file}: {err.strerror}") from None
    else:
        prompt = args.prompt
    if not prompt:
        raise ViasdError("the prompt is empty: give some text to continue")
    if args.method != "ar" and not args.draft:
        raise ViasdError(f"method {args.method} needs --draft")
    if args.method in ("viasd", "cascade_sd") and not (args.mask or args.keep_layers or args.independent):
        raise ViasdError(f"method {args.method} needs a slim verifier: pass --mask FILE or --keep-layers 0,2,...")
    tau = {}
    for name in ("tau_accept", "tau_slim"):
        values = getattr(args, name)
        if values:
            tau[name] = values[0] if len(values) == 1 else tuple(values)
    policy = DecodePolicy(
        method=args.method, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
        sampling=SamplingConfig(args.temperature, args.top_k, args.top_p), seed=args.seed,
        stop_strings=tuple(args.stop), score=args.score, confidence=args.confidence, max_lag=args.max_lag,
        gate=args.gate, verify_lagged=args.verify_lagged, verify_block=args.verify_block, router=args.router,
        oracle_budget=args.oracle_budget,
        cache=args.cache, compile=args.compile, reuse=args.reuse, rule=args.rule, alpha=args.alpha,
        gamma_slim=args.gamma_slim, **tau,
    )
    if (args.router == "learned") != (args.router_file is not None):
        raise ViasdError("--router learned and --router-file FILE go together")
    draft = args.draft if args.method != "ar" else None
    models = load_models(args.target, draft=draft, device=args.device, dtype=args.dtype,
                         trust_remote_code=args.trust_remote_code)
    if policy.needs_slim:
        n = num_decoder_layers(models.target)
        for path in args.mask:
            models.add_mask(RoutingMask.from_json(path, n))
        for text in args.keep_layers:
            models.add_mask(RoutingMask.parse(text, n))
        if args.independent:  # after the masks: the independent model is the largest level
            models.add_independent_from(args.independent, args.device, args.dtype, args.trust_remote_code)
    if args.router_file is not None:
        from ..training.router import load_router

        models.router = load_router(args.router_file)
    result = models.generate(prompt, policy)
    if args.json:
        print(json.dumps({"text": result.text, "token_ids": result.token_ids, "stats": result.stats.as_dict()}))
    else:
        print(result.text)
        print("---", file=sys.stderr)
        print(result.stats.summary(), file=sys.stderr)
    return 0
