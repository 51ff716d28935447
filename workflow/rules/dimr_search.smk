rule dimr_search:
    """The slim verifier's routing mask (Optuna, resumable: the study lives in models/optuna/), the baseline
    masks, the cost-ablation mask when study.runs asks for one, and the search plots."""
    input:
        # the calibration set; the corpus's test split and every model of the pair (the independent one
        # included) for the family table's agreement figures
        f"{DATA}/calibration.parquet",
        f"{DATA}/corpus",
        models=lambda w: pair_models(w.pair, ["target", "draft", "independent"]),
        workers=lambda w: search_workers("dimr", w.pair),
        params=params_file("dimr_search"),
    output:
        masks=directory(f"{MODELS}/masks/{{pair}}"),
        plots=report(
            directory(f"{REPORTS}/dimr/{{pair}}"),
            patterns=["{name}.png"],
            caption="../report/dimr.rst",
            category="DIMR search",
            labels={"pair": "{pair}", "plot": "{name}"},
        ),
    params:
        viasd=VIASD_ARGS,
    threads: 2
    resources:
        gpu=GPU,
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


rule dimr_worker:
    """One of `dimr.workers` processes sharing the pair's DIMR searches on the Optuna storage
    (`study.optuna_storage`): its share of the trials, nothing written but this marker."""
    input:
        f"{DATA}/calibration.parquet",
        models=lambda w: pair_models(w.pair, ["target", "draft"]),
        params=params_file("dimr_worker"),
    output:
        f"{MODELS}/workers/dimr/{{pair}}/worker-{{k}}.json",
    params:
        viasd=VIASD_ARGS,
    threads: 2
    resources:
        gpu=GPU,
        mem_mb=8000,
        runtime=120,
    log:
        "logs/dimr_worker/{pair}-{k}.log",
    conda:
        "../envs/viasd.yaml"
    shell:
        "OMP_NUM_THREADS={threads} viasd dimr-search {params.viasd} --pair {wildcards.pair} --worker {wildcards.k} "
        "> {output} 2> {log}"
