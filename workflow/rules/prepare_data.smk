rule prepare_data:
    """Stdlib corpus splits, tokenizer, calibration set and task prompts (one atomic directory)."""
    output:
        directory(DATA),
    params:
        viasd=VIASD_ARGS,
        seed=config["seed"],
        data=config["data"],
        tasks=config["tasks"],
    log:
        "logs/prepare_data.log",
    benchmark:
        "benchmarks/prepare_data.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "viasd prepare-data {params.viasd} > {log} 2>&1"
