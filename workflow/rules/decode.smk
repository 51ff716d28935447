rule decode:
    """One cell of the grid (pair x task x run) on the test prompts, timed against ar in the same job."""
    input:
        # the same inputs for every run, as in dvc.yaml's matrix stage (a run reads the ones it needs)
        f"{DATA}/tasks/{{task}}/{DECODE_SPLIT}.jsonl",
        models=lambda w: pair_models(w.pair, ["target", "draft", "independent"]),
        masks=f"{MODELS}/masks/{{pair}}",
        thresholds=f"{MODELS}/thresholds/{{pair}}-{{task}}",
    output:
        rows=f"{REPORTS}/decode/{{pair}}/{{task}}/{{run}}.jsonl",
        summary=f"{REPORTS}/decode/{{pair}}/{{task}}/{{run}}.json",
    params:
        viasd=VIASD_ARGS,
        seed=config["seed"],
        decode=config["decode"],
        task=task_params,
    threads: 2
    resources:
        mem_mb=8000,
        runtime=60,
    log:
        "logs/decode/{pair}/{task}/{run}.log",
    benchmark:
        "benchmarks/decode/{pair}/{task}/{run}.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "OMP_NUM_THREADS={threads} viasd decode {params.viasd} --pair {wildcards.pair} --task {wildcards.task} --run {wildcards.run} > {log} 2>&1"
