"""The pure decoding library: models, a prompt and a policy in, tokens and statistics out.

`policy` (what to run), `engine` (the decode loop and its session), `runner` / `kv_cache` (a model with
its cache), `routing` (the slim verifier routed out of the target's layers), `reuse` (the slim's work
shared with the full model), `intermediate` (an independent intermediate model), `sampling`,
`acceptance`, `tiers` and `stopping` (the rules), `stats` (the counters), `methods` (one block of each
decoding method). Nothing here imports tracking, searches, parameters files or the workflow
(`tests/test_packaging.py` checks it): those live at the stage boundary (`viasd.stages`, `viasd.cli`).
"""
