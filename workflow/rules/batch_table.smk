rule batch_table:
    """The study's speed against batch size for one pair x task: transformers' batched generate, ar, sd at its best
    gamma on dev and the tuned viasd, on the first batch_table.prompts test prompts at each of batch_table.sizes
    (empty: a file that says the table is off, nothing decoded)."""
    input:
        # the same inputs as dvc.yaml's matrix stage
        f"{DATA}/tasks/{{task}}/test.jsonl",
        models=lambda w: pair_models(w.pair, ["target", "draft"]),
        masks=f"{MODELS}/masks/{{pair}}",
        thresholds=f"{MODELS}/thresholds/{{pair}}-{{task}}",
        router=f"{MODELS}/routers/{{pair}}",
        params=params_file("batch_table"),
    output:
        directory(f"{REPORTS}/batch/{{pair}}/{{task}}"),
    params:
        viasd=VIASD_ARGS,
    # both cores: batched passes use a second thread, and the timed rounds run with no job beside them
    threads: 2
    resources:
        gpu=GPU,
        mem_mb=8000,
        runtime=120,
    log:
        "logs/batch_table/{pair}/{task}.log",
    benchmark:
        "benchmarks/batch_table/{pair}/{task}.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "OMP_NUM_THREADS={threads} viasd batch-table {params.viasd} --pair {wildcards.pair} --task {wildcards.task} "
        "> {log} 2>&1"
