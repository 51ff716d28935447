rule dimr_search:
    """The slim verifier's routing mask (Optuna, resumable), the baseline masks and the search plots."""
    input:
        DATA,
        models=lambda w: pair_models(w.pair),
    output:
        mask=f"{MODELS}/masks/{{pair}}.json",
        trace=f"{MODELS}/masks/{{pair}}.trace.jsonl",
        baselines=expand(f"{MODELS}/masks/{{{{pair}}}}-{{baseline}}.json", baseline=BASELINES),
        curve=report(f"{REPORTS}/dimr/{{pair}}-search.png", category="DIMR search", labels={"pair": "{pair}", "plot": "search curve"}),
        layers=report(f"{REPORTS}/dimr/{{pair}}-layers.png", category="DIMR search", labels={"pair": "{pair}", "plot": "layer-keep map"}),
    params:
        viasd=VIASD_ARGS,
        seed=config["seed"],
        dimr=config["dimr"],
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


rule dimr_search_cost:
    """The cost ablation: the same search with the other cost function (no baselines)."""
    input:
        DATA,
        models=lambda w: pair_models(w.pair),
    output:
        mask=f"{MODELS}/masks/{{pair}}.cost-{{cost}}.json",
        trace=f"{MODELS}/masks/{{pair}}.cost-{{cost}}.trace.jsonl",
        curve=f"{REPORTS}/dimr/{{pair}}.cost-{{cost}}-search.png",
        layers=f"{REPORTS}/dimr/{{pair}}.cost-{{cost}}-layers.png",
    params:
        viasd=VIASD_ARGS,
        seed=config["seed"],
        dimr=config["dimr"],
    threads: 2
    resources:
        mem_mb=8000,
        runtime=120,
    log:
        "logs/dimr_search/{pair}.cost-{cost}.log",
    benchmark:
        "benchmarks/dimr_search/{pair}.cost-{cost}.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "OMP_NUM_THREADS={threads} viasd dimr-search {params.viasd} --pair {wildcards.pair} --cost {wildcards.cost} > {log} 2>&1"
