# The VIA-SD study: prepare_data -> train_models -> dimr_search -> tune_thresholds -> decode -> evaluate -> report.
# Every rule calls a `viasd` subcommand; parameters come from params.yaml (validated on load), with
# `--configfile config/smoke.yaml` merged over it for the smoke configuration.
from snakemake.utils import min_version

min_version("9.0")


configfile: "params.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/prepare_data.smk"
include: "workflow/rules/train_models.smk"
include: "workflow/rules/dimr_search.smk"
include: "workflow/rules/tune_thresholds.smk"
include: "workflow/rules/decode.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        rules.report.output,


onstart:
    shell(f"viasd tracking-init {VIASD_ARGS}")
