rule report:
    """Tables (markdown + CSV) per pair x task, the speed-quality frontier and per-tier plots."""
    input:
        evals=eval_files(),
        dimr=expand(f"{REPORTS}/dimr/{{pair}}", pair=STUDY["pairs"]),
        # the family table: the masks' agreement figures (the models' training reports come with them)
        masks=expand(f"{MODELS}/masks/{{pair}}", pair=STUDY["pairs"]),
        thresholds=expand(f"{MODELS}/thresholds/{{pair}}-{{task}}", pair=STUDY["pairs"], task=STUDY["tasks"]),
        # the router's held-out AUC and ECE
        routers=expand(f"{MODELS}/routers/{{pair}}", pair=STUDY["pairs"]),
        # speed against batch size (batch_table.sizes; a file saying it is off when empty)
        batch=expand(f"{REPORTS}/batch/{{pair}}/{{task}}", pair=STUDY["pairs"], task=STUDY["tasks"]),
        params=params_file("report"),
    output:
        summary=report(f"{REPORTS}/summary.md", caption="../report/summary.rst", category="Summary"),
        metrics=f"{REPORTS}/metrics.json",
        # the series dvc.yaml's top-level plots draw
        plot_data=directory(f"{REPORTS}/plot-data"),
        tables=expand(f"{REPORTS}/tables/{{pair}}-{{task}}{{kind}}.{{ext}}", pair=STUDY["pairs"], task=STUDY["tasks"], kind=["", "-slims"], ext=["md", "csv"]),
        family=expand(f"{REPORTS}/tables/{{pair}}-family.{{ext}}", pair=STUDY["pairs"], ext=["md", "csv"]),
        positions=expand(f"{REPORTS}/tables/{{pair}}-{{task}}-positions.md", pair=STUDY["pairs"], task=STUDY["tasks"]),
        frontier=report(
            expand(f"{REPORTS}/plots/{{pair}}-{{task}}-frontier.png", pair=STUDY["pairs"], task=STUDY["tasks"]),
            caption="../report/frontier.rst",
            category="Speed vs quality",
        ),
        tiers=report(
            expand(f"{REPORTS}/plots/{{pair}}-{{task}}-tiers.png", pair=STUDY["pairs"], task=STUDY["tasks"]),
            caption="../report/tiers.rst",
            category="Tier breakdown",
        ),
    params:
        viasd=VIASD_ARGS,
    log:
        "logs/report.log",
    benchmark:
        "benchmarks/report.tsv"
    conda:
        "../envs/viasd.yaml"
    shell:
        "viasd report {params.viasd} > {log} 2>&1"
