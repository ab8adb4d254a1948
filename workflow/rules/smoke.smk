# Same launcher, model and parallelism as train: what passes here is what train will run. Before its
# probe it takes the rehearsal of the run's settings (workflow/rules/rehearse.smk): the rule's, when it
# is current, or rehearsed there and then. Not an input: a rehearsal redone for settings that change
# only the memory (train.micro_batch, plan.gpu) must rerun neither smoke nor train, and Snakemake's
# ancient() cannot say so (a job below an ancient input of a job that reruns is never checked itself).
# report.json (the checks and the measurements) is written only when the gate passes (or smoke.gate
# is false). Train plans its steps from those measurements itself; the plan rule prices them for
# people (plan.json, plan.md), so a new price reruns neither smoke nor train.
rule smoke:
    input:
        shards=upstream("shard"),
        tokenizer=upstream("tokenizer", "tokenizer.json"),
    output:
        report=P.output("smoke", "report.json"),
    params:
        script=script("smoke"),
        **stage_params("smoke"),
        launch=launch_settings,
        rank_threads=threads_per_rank,
        out=lambda w, output: Path(output.report).parent,
        rehearsal=lambda w: LAYOUTS[w.run].output("rehearse"),
        rehearse_tracked=lambda w: kiln_settings.Untracked(kiln_settings.tracked(RUNS[w.run], "rehearse")),
        rehearse_untracked=lambda w: kiln_settings.untracked(RUNS[w.run], "rehearse"),
    threads: 64
    resources:
        **rank_resources(),
    conda:
        CONDA_ENV
    log:
        P.log("smoke"),
    benchmark:
        P.benchmark("smoke")
    shell:
        "python -m kiln.train.launch --train {params.launch:q} --stage smoke -- {params.script} --params {params.tracked:q} --untracked {params.untracked:q} --shards {input.shards}"
        " --tokenizer {input.tokenizer} --out {params.out} --threads {params.rank_threads} --rehearsal {params.rehearsal}"
        " --rehearse-params {params.rehearse_tracked:q} --rehearse-untracked {params.rehearse_untracked:q} > {log} 2>&1"


rule plan:
    input:
        smoke=rules.smoke.output.report,
    output:
        plan=P.output("plan", "plan.json"),
        plan_md=report(P.output("plan", "plan.md"), caption="../report/plan.rst", category="Smoke"),
    params:
        script=script("plan"),
        **stage_params("plan"),
    conda:
        CONDA_ENV
    log:
        P.log("plan"),
    benchmark:
        P.benchmark("plan")
    shell:
        "python {params.script} --params {params.tracked:q} --untracked {params.untracked:q} --smoke {input.smoke}"
        " --plan {output.plan} --markdown {output.plan_md} > {log} 2>&1"
