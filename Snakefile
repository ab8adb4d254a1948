# Kiln: download -> tokenizer -> pretokenize -> shard -> smoke -> train -> eval -> report (eval_data beside;
# rehearse, from the config alone, before smoke)
# Thin by design: the config is validated here, before any job runs; each stage is one rule in
# workflow/rules/<stage>.smk calling one script in workflow/scripts/ (the work lives in src/kiln/).

from pathlib import Path

from kiln.config import settings as kiln_settings
from kiln import layout as kiln_layout
from kiln import config as kiln_config
from kiln.plan.verdict import SmokeReport
from kiln.config.run_config import RunConfig
from kiln.data.tokenizer_build import training_memory_mb


# Which runs: the files given with --configfile, exactly as written (no `configfile:` directive here,
# so a run file is never merged over the embedded default), or config/config.yaml when none is
# given; --config key=value overrides on top. A config with a `sweep` is one run per arm
# (kiln.config.sweep). Defaults are filled in and every cross-field rule is checked now, before any job
# starts; an error names the key path (kiln.config, kiln.config).
EXPERIMENT = kiln_config.resolve_experiment(workflow.config_settings.configfiles, workflow.config_settings.config)
RUNS = EXPERIMENT.runs
SWEEP = EXPERIMENT.name if EXPERIMENT.sweep else None
config.clear()
config.update(RUNS[EXPERIMENT.name] if not SWEEP else {"run_name": SWEEP, "runs": RUNS})
# Where each run's stages land (kiln.layout): data stages under results/data/<stage>-<key>, shared by
# every run whose data sections are equal; smoke, train, eval and report under results/<run>/.
LAYOUTS = {run: kiln_layout.Layout(cfg) for run, cfg in RUNS.items()}

# `snakemake --report report.html` gathers the outputs marked with report() in the rules.
report: "workflow/report/workflow.rst"
SCRIPTS = Path(workflow.basedir) / "workflow" / "scripts"


include: "workflow/rules/common.smk"
include: "workflow/rules/download.smk"
include: "workflow/rules/tokenizer.smk"
include: "workflow/rules/pretokenize.smk"
include: "workflow/rules/shard.smk"
include: "workflow/rules/verify.smk"
include: "workflow/rules/eval_data.smk"
include: "workflow/rules/rehearse.smk"
include: "workflow/rules/smoke.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/sweep.smk"


# Jobs that run where snakemake runs under a cluster profile: no GPU, a CPU minute (the login node).
localrules:
    rehearse,


rule all:
    input:
        [layout.output("rehearse") for layout in LAYOUTS.values()],  # first (priority), from the config alone
        [layout.output("report") for layout in LAYOUTS.values()],
        sweep_outputs(),
    default_target: True


onstart:
    resubmit_preempted_train()  # workflow/rules/common.smk
    request_forced_retrains()  # workflow/rules/common.smk
    for run, layout in LAYOUTS.items():
        layout.write()  # results/<run>/layout.json: where its data stages are, for kiln status
    if SWEEP:
        kiln_layout.write_sweep_index(SWEEP, list(RUNS))


onsuccess:
    for run, layout in LAYOUTS.items():
        print(f"Kiln: run '{run}' is complete; the report is {layout.output('report')}")
    if SWEEP:
        print(f"Kiln: sweep '{SWEEP}' is complete; the overlay report is {sweep_outputs()[0]}")
