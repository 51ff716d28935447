rule prepare_corpus:
    """Stdlib corpus splits, tokenizer, token datasets, calibration set: what training and the mask
    search read (no task prompt, so a task's settings never retrain a model)."""
    input:
        params=params_file("prepare_corpus"),
    output:
        tokenizer=directory(f"{DATA}/tokenizer"),
        corpus=directory(f"{DATA}/corpus"),
        calibration=f"{DATA}/calibration.parquet",
        manifest=f"{DATA}/manifest.json",
    params:
        viasd=VIASD_ARGS,
    log:
        "logs/prepare_corpus.log",
    benchmark:
        "benchmarks/prepare_corpus.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "viasd prepare-data {params.viasd} --only corpus > {log} 2>&1"


rule prepare_task:
    """One task's prompts and references for one split; its parameters leave out the other split's
    prompt count, so changing the test prompts re-runs no threshold search (which reads dev)."""
    input:
        tokenizer=f"{DATA}/tokenizer",
        manifest=f"{DATA}/manifest.json",
        params=params_file("prepare_task"),
    output:
        f"{DATA}/tasks/{{task}}/{{split}}.jsonl",
    params:
        viasd=VIASD_ARGS,
    log:
        "logs/prepare_task/{task}-{split}.log",
    benchmark:
        "benchmarks/prepare_task/{task}-{split}.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "viasd prepare-data {params.viasd} --only tasks --task {wildcards.task} --split {wildcards.split} > {log} 2>&1"
