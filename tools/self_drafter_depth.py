"""The dev-side measurement behind `models.self_drafter.layers`: SD drafting with the target's first L layers
(self-speculation) at each γ, against SD with the pair's draft model at each γ, on the first dev prompts of each
task of the study.

Every policy decodes every prompt, in a Williams order that changes from prompt to prompt
(`viasd.evaluation.run_order.interleaved`), after one warm-up; every output is checked equal to greedy `ar`'s.
Each run's ratio is the decode seconds per token (the prefill apart) of SD with the draft model at `--anchor-gamma`
over the run's, the geometric mean of per-prompt ratios with its 95 % interval clustered by source file
(`viasd.metrics.speed.paired_ratio`): above 1, the run is faster. Run it in a study checkout once the target and
the draft are trained, before the self-drafter's router is fitted (the depth is a parameter the router and the
threshold search take as given):

    python tools/self_drafter_depth.py --config config/drafters.yaml --depths 1,2,3,4,5 --prompts 16
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import replace
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--config", action="append", default=[], help="a file merged over --params (repeatable)")
    ap.add_argument("--prompts", type=int, default=16, help="the first dev prompts of each task")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--depths", default="1,2,3,4,5", help="self-drafter depths: the target's first L layers")
    ap.add_argument("--gammas", default="2,3,4")
    ap.add_argument("--anchor-gamma", type=int, default=3, help="SD with the draft model at this γ: the ratios' base")
    ap.add_argument("--rounds", type=int, default=1, help="timed rounds per prompt")
    ap.add_argument("--out", type=Path, default=Path("self_drafter_depth.json"))
    args = ap.parse_args()

    from tqdm.auto import tqdm

    from viasd import config
    from viasd.decoding.policy import DecodePolicy
    from viasd.evaluation.run_order import interleaved
    from viasd.io import write_json
    from viasd.metrics.speed import paired_ratio
    from viasd.models import load_models
    from viasd.tasks import get_task, load_examples

    params = config.load(args.params, args.config)
    pair = params.pair()
    models = load_models(pair.target, draft=pair.draft, device=params.device, dtype=pair.dtype,
                         trust_remote_code=pair.trust_remote_code)
    gammas = [int(g) for g in args.gammas.split(",")]
    if args.anchor_gamma not in gammas:
        raise SystemExit(f"--anchor-gamma {args.anchor_gamma} is not one of --gammas {args.gammas}")
    base = DecodePolicy(method="sd", gamma=args.anchor_gamma, max_new_tokens=args.max_new_tokens, eos_token_ids=(),
                        **params.decode.engine())
    runs = {f"draft-g{g}": (models, replace(base, gamma=g)) for g in gammas}
    for depth in (int(d) for d in args.depths.split(",")):
        own = copy.copy(models)  # the same target; its own self-drafter
        own.set_self_drafter(list(range(depth)))
        runs |= {f"self{depth}-g{g}": (own, replace(base, gamma=g, drafter="self")) for g in gammas}
    names, anchor, out = list(runs), f"draft-g{args.anchor_gamma}", {}
    for task in params.study.tasks:
        examples = load_examples(params.data.dir, task, "dev")[: args.prompts]
        prompts = [e.prompt_ids if e.prompt_ids is not None else models.encode(e.prompt) for e in examples]
        groups = [get_task(task).group(e) for e in examples]
        greedy = [models.generate(p, replace(base, method="ar")).token_ids for p in prompts]
        for name in names:  # warm-up
            runs[name][0].generate(prompts[0], runs[name][1])
        seconds = {name: [[] for _ in prompts] for name in names}
        acceptance = {name: [] for name in names}
        for rnd in range(args.rounds):
            for i, prompt in enumerate(tqdm(prompts, desc=f"{task} round {rnd}")):
                for name in interleaved(names, rnd, i):
                    ms, policy = runs[name]
                    result = ms.generate(prompt, policy)
                    if result.token_ids != greedy[i]:
                        raise SystemExit(f"{name} on {task} dev prompt {i} differs from greedy ar: not lossless")
                    seconds[name][i].append(result.stats.decode_seconds_per_token)
                    if rnd == 0:
                        acceptance[name].append(result.stats.acceptance_rate)
        mean = {name: [sum(s) / len(s) for s in seconds[name]] for name in names}
        out[task] = {name: {"vs_anchor": paired_ratio(mean[anchor], mean[name], groups),
                            "acceptance": sum(acceptance[name]) / len(acceptance[name])} for name in names}
        for name, row in out[task].items():
            r = row["vs_anchor"]
            interval = f"[{r['low']:.3f}, {r['high']:.3f}]" if r["low"] is not None else "(one source file)"
            print(f"{task:22s} {name:10s} {r['ratio']:.3f} {interval}  acceptance {row['acceptance']:.2f}")
    write_json(args.out, {"anchor": anchor, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
                          "tasks": out})


if __name__ == "__main__":
    main()
