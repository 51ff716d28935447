rule evaluate:
    """The task's quality metrics for the decode outputs of one pair x task (pass@1 in a sandboxed process)."""
    input:
        f"{DATA}/tasks/{{task}}/{DECODE_SPLIT}.jsonl",
        rows=expand(f"{REPORTS}/decode/{{{{pair}}}}/{{{{task}}}}/{{run}}.jsonl", run=RUNS),
        summaries=expand(f"{REPORTS}/decode/{{{{pair}}}}/{{{{task}}}}/{{run}}.json", run=RUNS),
        models=lambda w: pair_models(w.pair, ["target"]),  # its tokenizer (the decode scored the outputs)
        params=params_file("evaluate"),
    output:
        expand(f"{REPORTS}/eval/{{{{pair}}}}/{{{{task}}}}/{{run}}.json", run=RUNS),
    params:
        viasd=VIASD_ARGS,
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    log:
        "logs/evaluate/{pair}/{task}.log",
    benchmark:
        "benchmarks/evaluate/{pair}/{task}.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "OMP_NUM_THREADS={threads} viasd evaluate {params.viasd} --pair {wildcards.pair} --task {wildcards.task} > {log} 2>&1"
