rule tune_thresholds:
    """VIA-SD's tau_accept, tau_slim, gamma and tier rules for a pair and task, on the dev split."""
    input:
        DATA,
        models=lambda w: pair_models(w.pair),
        masks=f"{MODELS}/masks/{{pair}}",
    output:
        thresholds=f"{MODELS}/thresholds/{{pair}}-{{task}}.json",
        trace=f"{MODELS}/thresholds/{{pair}}-{{task}}.trace.jsonl",
        plot=report(f"{REPORTS}/thresholds/{{pair}}-{{task}}.png", category="Threshold tuning", labels={"pair": "{pair}", "task": "{task}"}),
    params:
        viasd=VIASD_ARGS,
        seed=config["seed"],
        thresholds=config["thresholds"],
        task=task_params,
    threads: 2
    resources:
        mem_mb=8000,
        runtime=120,
    log:
        "logs/tune_thresholds/{pair}-{task}.log",
    benchmark:
        "benchmarks/tune_thresholds/{pair}-{task}.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "OMP_NUM_THREADS={threads} viasd tune-thresholds {params.viasd} --pair {wildcards.pair} --task {wildcards.task} > {log} 2>&1"
