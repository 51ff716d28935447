rule tune_thresholds:
    """VIA-SD's tau_accept, tau_slim, gamma and tier rules for a pair and task, on the dev split: for the
    DIMR mask and (thresholds.per_slim) every slim ablation of study.runs, one file set per slim."""
    input:
        f"{DATA}/tasks/{{task}}/dev.jsonl",
        models=lambda w: pair_models(w.pair, ["target", "draft", "independent"]),
        masks=f"{MODELS}/masks/{{pair}}",
        router=f"{MODELS}/routers/{{pair}}",
        # sd-drafter_feature at SD's best gamma with the feature drafter, viasd-drafter_feature's own search
        drafter=lambda w: feature_drafter(w.pair, ["sd", "viasd"]),
        workers=lambda w: search_workers("thresholds", f"{w.pair}-{w.task}"),
        searches=lambda w: search_parts(w.pair, w.task),
        params=params_file("tune_thresholds"),
    output:
        thresholds=directory(f"{MODELS}/thresholds/{{pair}}-{{task}}"),
        plots=report(
            directory(f"{REPORTS}/thresholds/{{pair}}-{{task}}"),
            patterns=["{slim}.png"],
            caption="../report/thresholds.rst",
            category="Threshold tuning",
            labels={"pair": "{pair}", "task": "{task}", "slim": "{slim}"},
        ),
    params:
        viasd=VIASD_ARGS,
    # one thread (see decode.smk): the two tasks' searches run side by side on two cores
    threads: 1
    resources:
        gpu=GPU,
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


rule thresholds_worker:
    """One of `thresholds.workers` processes sharing a pair and task's threshold searches on the Optuna
    storage (`study.optuna_storage`): its share of every slim's trials, nothing written but this marker."""
    input:
        f"{DATA}/tasks/{{task}}/dev.jsonl",
        models=lambda w: pair_models(w.pair, ["target", "draft", "independent"]),
        masks=f"{MODELS}/masks/{{pair}}",
        router=f"{MODELS}/routers/{{pair}}",
        params=params_file("tune_thresholds"),
    output:
        f"{MODELS}/workers/thresholds/{{pair}}-{{task}}/worker-{{k}}.json",
    params:
        viasd=VIASD_ARGS,
    threads: 1
    resources:
        gpu=GPU,
        mem_mb=8000,
        runtime=120,
    log:
        "logs/thresholds_worker/{pair}-{task}-{k}.log",
    conda:
        "../envs/viasd.yaml"
    shell:
        "OMP_NUM_THREADS={threads} viasd tune-thresholds {params.viasd} --pair {wildcards.pair} --task {wildcards.task} "
        "--worker {wildcards.k} > {output} 2> {log}"


rule thresholds_search:
    """One of a pair and task's threshold searches run whole as a job of its own (`thresholds.split_searches`):
    the first (the hand rules', else main's) alone, then each other, starting from it, side by side. Its
    trials are the serial search's; nothing is written but this marker (the Optuna study holds the trials)."""
    input:
        f"{DATA}/tasks/{{task}}/dev.jsonl",
        models=lambda w: pair_models(w.pair, ["target", "draft", "independent"] if w.search == "independent"
                                     else ["target", "draft"]),
        masks=f"{MODELS}/masks/{{pair}}",
        # only main's search draws the learned router: the hand rules' search runs beside the router's fit
        router=lambda w: [f"{MODELS}/routers/{w.pair}"] if w.search == "main" else [],
        first=lambda w: [m for m in search_parts(w.pair, w.task, first=True) if not m.endswith(f"-{w.search}.json")],
        params=params_file("tune_thresholds"),
    output:
        f"{MODELS}/workers/thresholds/{{pair}}-{{task}}/search-{{search}}.json",
    # the learned router's search is the longest (thresholds.n_trials): started first, the slim ablations'
    # short ones fill the other cores around it
    priority: lambda w: 1 if w.search == "main" else 0
    params:
        viasd=VIASD_ARGS,
    threads: 1
    resources:
        gpu=GPU,
        mem_mb=8000,
        runtime=120,
    log:
        "logs/thresholds_search/{pair}-{task}-{search}.log",
    benchmark:
        "benchmarks/thresholds_search/{pair}-{task}-{search}.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "OMP_NUM_THREADS={threads} viasd tune-thresholds {params.viasd} --pair {wildcards.pair} --task {wildcards.task} "
        "--search {wildcards.search} > {output} 2> {log}"
