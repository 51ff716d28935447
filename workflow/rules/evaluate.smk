rule evaluate:
    """The task's quality metrics for one decode output (pass@1 in a sandboxed process)."""
    input:
        f"{DATA}/tasks/{{task}}/{DECODE_SPLIT}.jsonl",
        rows=f"{REPORTS}/decode/{{pair}}/{{task}}/{{run}}.jsonl",
        summary=f"{REPORTS}/decode/{{pair}}/{{task}}/{{run}}.json",
        models=lambda w: pair_models(w.pair, ["target"]),
    output:
        f"{REPORTS}/eval/{{pair}}/{{task}}/{{run}}.json",
    params:
        viasd=VIASD_ARGS,
        task=task_params,
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    log:
        "logs/evaluate/{pair}/{task}/{run}.log",
    benchmark:
        "benchmarks/evaluate/{pair}/{task}/{run}.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "OMP_NUM_THREADS={threads} viasd evaluate {params.viasd} --pair {wildcards.pair} --task {wildcards.task} --run {wildcards.run} > {log} 2>&1"
