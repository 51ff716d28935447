rule train_model:
    """One model of the embedded default family (hub pairs skip this); resumes from its checkpoint."""
    input:
        CORPUS,
        # the draft is distilled from the target (DVC's train_draft stage has the same dependency)
        teacher=lambda w: pair_models(FAMILY, ["target"]) if w.role == "draft" else [],
    output:
        directory(f"{MODELS}/{FAMILY}/{{role}}"),
    params:
        viasd=VIASD_ARGS,
        seed=config["seed"],
        arch=lambda w: config["models"]["families"][FAMILY],
        context=config["models"]["families"][FAMILY]["context"],
        train=config["train"],
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
    """The family's feature drafter (EAGLE-3-style, on the target's shared trunk): built when a run of the grid
    drafts with it (a drafter_feature ablation), or by name (`snakemake ... train_drafter`)."""
    input:
        CORPUS,
        target=pair_models(FAMILY, ["target"]),
    output:
        directory(f"{MODELS}/{FAMILY}/feature_drafter"),
    params:
        viasd=VIASD_ARGS,
        seed=config["seed"],
        arch=lambda w: config["models"]["families"][FAMILY].get("feature_drafter"),
        train=config["train"],
    threads: 4
    resources:
        gpu=GPU,
        mem_mb=8000,
        runtime=120,
    log:
        "logs/train_drafter/feature_drafter.log",
    benchmark:
        "benchmarks/train_drafter/feature_drafter.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "OMP_NUM_THREADS={threads} viasd train-drafter {params.viasd} > {log} 2>&1"
