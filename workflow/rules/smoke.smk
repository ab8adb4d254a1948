# Same launcher, model and parallelism as train: what passes here is what train will run.
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
        " --tokenizer {input.tokenizer} --out {params.out} --threads {params.rank_threads} > {log} 2>&1"


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
