rule dimr_search:
    """The slim verifier's routing mask (Optuna, resumable: the study lives in models/optuna/), the baseline
    masks, the cost-ablation mask when study.runs asks for one, and the search plots."""
    input:
        # the calibration set; the corpus's test split and every model of the pair (the independent one
        # included) for the family table's agreement figures
        f"{DATA}/calibration.parquet",
        f"{DATA}/corpus",
        models=lambda w: pair_models(w.pair, ["target", "draft", "independent"]),
    output:
        masks=directory(f"{MODELS}/masks/{{pair}}"),
        plots=report(
            directory(f"{REPORTS}/dimr/{{pair}}"),
            patterns=["{name}.png"],
            category="DIMR search",
            labels={"pair": "{pair}", "plot": "{name}"},
        ),
    params:
        viasd=VIASD_ARGS,
        seed=config["seed"],
        dimr=config["dimr"],
        runs=STUDY["runs"],
    threads: 2
    resources:
        mem_mb=8000,
        runtime=120,
    log:
        "logs/dimr_search/{pair}.log",
    benchmark:
        "benchmarks/dimr_search/{pair}.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "OMP_NUM_THREADS={threads} viasd dimr-search {params.viasd} --pair {wildcards.pair} > {log} 2>&1"
