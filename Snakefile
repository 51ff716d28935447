# The VIA-SD study: prepare_corpus -> train_model -> dimr_search -> train_router -> tune_thresholds -> decode -> evaluate -> report
# (and tune_thresholds -> batch_table -> report: speed against batch size)
# (the rules, in that order: workflow/report/workflow.rst, the report's front page).
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
include: "workflow/rules/train_router.smk"
include: "workflow/rules/tune_thresholds.smk"
include: "workflow/rules/decode.smk"
include: "workflow/rules/batch_table.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        rules.report.output,
        # every drafter of study.drafters, as DVC's train_drafter stages build them (none by default)
        expand(f"{MODELS}/{FAMILY}/{{drafter}}_drafter", drafter=STUDY.get("drafters", [])),


# One MLflow parent run per invocation: every job's stage run is nested under it (the jobs inherit the
# parent's id through PARENT_RUN, see common.smk), and it ends FINISHED or FAILED with the workflow.
onstart:
    shell(f"viasd tracking-init {VIASD_ARGS}")
    parent = shell(f"viasd tracking-init {VIASD_ARGS} --start-parent study/{STUDY['name']}", read=True)
    os.environ[PARENT_RUN] = (parent.decode() if isinstance(parent, bytes) else parent).strip()


onsuccess:
    end_parent("FINISHED")
    record_in_dvc()


onerror:
    end_parent("FAILED")
