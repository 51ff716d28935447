rule train_router:
    """The learned router of the pair's DIMR slim: oracle decodes of the calibration windows give the rows
    (block features, the oracle's labels), two calibrated logistic heads are fitted on them (held-out AUC,
    ECE and a reliability plot beside the router)."""
    input:
        f"{DATA}/calibration.parquet",
        models=lambda w: pair_models(w.pair, ["target", "draft"]),
        masks=f"{MODELS}/masks/{{pair}}",
        # a viasd-drafter_feature run: a router refitted on the feature drafter's blocks too
        drafter=lambda w: feature_drafter(w.pair, ["viasd"]),
        params=params_file("train_router"),
    output:
        router=directory(f"{MODELS}/routers/{{pair}}"),
        plots=report(
            directory(f"{REPORTS}/router/{{pair}}"),
            patterns=["{name}.png"],
            caption="../report/router.rst",
            category="Router",
            labels={"pair": "{pair}", "plot": "{name}"},
        ),
    params:
        viasd=VIASD_ARGS,
    # main's threshold search waits for it; the hand rules' searches (thresholds.split_searches) run beside it,
    # else it runs alone: both cores
    priority: 1
    threads: 2
    resources:
        gpu=GPU,
        mem_mb=8000,
        runtime=60,
    log:
        "logs/train_router/{pair}.log",
    benchmark:
        "benchmarks/train_router/{pair}.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "OMP_NUM_THREADS={threads} viasd train-router {params.viasd} --pair {wildcards.pair} > {log} 2>&1"
