rule train_model:
    """One model of the embedded default family (hub pairs skip this); resumes from its checkpoint."""
    input:
        CORPUS,
        # the draft is distilled from the target (DVC's train_draft stage has the same dependency)
        teacher=lambda w: pair_models(FAMILY, ["target"]) if w.role == "draft" else [],
        params=params_file("train_model"),
    output:
        directory(f"{MODELS}/{FAMILY}/{{role}}"),
    params:
        viasd=VIASD_ARGS,
    threads: 4
    resources:
        gpu=GPU,
        mem_mb=8000,
        runtime=240,
    log:
        "logs/train_model/{role}.log",
    benchmark:
        "benchmarks/train_model/{role}.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "OMP_NUM_THREADS={threads} viasd train-model {params.viasd} --role {wildcards.role} > {log} 2>&1"


rule train_drafter:
    """A drafter of study.drafters for the family's target (the feature drafter: EAGLE-3-style, on the target's
    shared trunk), for the runs that draft with it (``sd-drafter_feature``, ``viasd-drafter_feature``)."""
    input:
        CORPUS,
        target=pair_models(FAMILY, ["target"]),
        params=params_file("train_drafter"),
    output:
        directory(f"{MODELS}/{FAMILY}/{{drafter}}_drafter"),
    params:
        viasd=VIASD_ARGS,
    threads: 4
    resources:
        gpu=GPU,
        mem_mb=8000,
        runtime=120,
    log:
        "logs/train_drafter/{drafter}.log",
    benchmark:
        "benchmarks/train_drafter/{drafter}.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "OMP_NUM_THREADS={threads} viasd train-drafter {params.viasd} --drafter {wildcards.drafter} > {log} 2>&1"
