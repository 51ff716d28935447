rule decode:
    """One cell of the grid (pair x task x run) on the test prompts, timed against ar in the same job."""
    input:
        DATA,
        unpack(run_inputs),
        models=run_models,
    output:
        rows=f"{REPORTS}/decode/{{pair}}/{{task}}/{{run}}.jsonl",
        summary=f"{REPORTS}/decode/{{pair}}/{{task}}/{{run}}.json",
    params:
        viasd=VIASD_ARGS,
        seed=config["seed"],
        decode=config["decode"],
        task=task_params,
    threads: 2
    resources:
        mem_mb=8000,
        runtime=60,
    log:
        "logs/decode/{pair}/{task}/{run}.log",
    benchmark:
        "benchmarks/decode/{pair}/{task}/{run}.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "OMP_NUM_THREADS={threads} viasd decode {params.viasd} --pair {wildcards.pair} --task {wildcards.task} --run {wildcards.run} > {log} 2>&1"
