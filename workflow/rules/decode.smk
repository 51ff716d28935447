rule decode:
    """The grid's runs for one pair x task on the test prompts, one load of the pair: each prompt decoded
    once with ar and once with every run, side by side (speedup_vs_ar and agreement within the job)."""
    input:
        # the same inputs as dvc.yaml's matrix stage (a run reads the ones it needs)
        f"{DATA}/tasks/{{task}}/{DECODE_SPLIT}.jsonl",
        models=lambda w: pair_models(w.pair, ["target", "draft", "independent"]),
        masks=f"{MODELS}/masks/{{pair}}",
        thresholds=f"{MODELS}/thresholds/{{pair}}-{{task}}",
        # a viasd run tuned with the learned router loads it
        router=f"{MODELS}/routers/{{pair}}",
        # the runs with a drafter_feature ablation draft with the family's feature drafter
        drafter=lambda w: feature_drafter(w.pair),
        params=params_file("decode"),
    output:
        rows=expand(f"{REPORTS}/decode/{{{{pair}}}}/{{{{task}}}}/{{run}}.jsonl", run=RUNS),
        summaries=expand(f"{REPORTS}/decode/{{{{pair}}}}/{{{{task}}}}/{{run}}.json", run=RUNS),
    params:
        viasd=VIASD_ARGS,
    # one thread: at batch 1 a small model gains little from a second thread, while two one-thread jobs side by side
    # each keep most of their speed (README, "Cores and threads"); more with --set-threads decode=N
    threads: 1
    resources:
        gpu=GPU,
        mem_mb=8000,
        runtime=120,
    log:
        "logs/decode/{pair}/{task}.log",
    benchmark:
        "benchmarks/decode/{pair}/{task}.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "OMP_NUM_THREADS={threads} viasd decode {params.viasd} --pair {wildcards.pair} --task {wildcards.task} > {log} 2>&1"
