# Kiln: download -> tokenizer -> pretokenize -> shard -> smoke -> train -> eval -> report
# Thin by design: the config is validated here, before any job runs; each stage is one rule in
# workflow/rules/<stage>.smk calling one script in workflow/scripts/ (the work lives in src/kiln/).

from pathlib import Path

from kiln import config as kiln_config
from kiln import run_config


# Which run: the files given with --configfile, exactly as written (no `configfile:` directive here,
# so a run file is never merged over the embedded default), or config/config.yaml when none is
# given; --config key=value overrides on top. Defaults are filled in and every cross-field rule is
# checked now, before any job starts; an error names the key path (kiln.config, kiln.run_config).
config.clear()
config.update(run_config.resolve(workflow.config_settings.configfiles, workflow.config_settings.config))

RUN = f"results/{config['run_name']}"

# `snakemake --report report.html` gathers the outputs marked with report() in the rules.
report: "workflow/report/workflow.rst"
SCRIPTS = Path(workflow.basedir) / "workflow" / "scripts"


include: "workflow/rules/common.smk"
include: "workflow/rules/download.smk"
include: "workflow/rules/tokenizer.smk"
include: "workflow/rules/pretokenize.smk"
include: "workflow/rules/shard.smk"
include: "workflow/rules/verify.smk"
include: "workflow/rules/smoke.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        rules.report.output.report,
    default_target: True


onsuccess:
    print(f"Kiln: run '{config['run_name']}' is complete; the report is {RUN}/report.md")
