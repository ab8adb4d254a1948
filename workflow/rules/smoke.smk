# Same launcher, model and parallelism as train: what passes here is what train will run.
# report.json is written only when the gate passes (or smoke.gate is false).
rule smoke:
    input:
        shards=upstream("shard"),
        tokenizer=upstream("tokenizer", "tokenizer.json"),
    output:
        report=P.output("smoke", "report.json"),
        plan=P.output("smoke", "plan.json"),
        plan_md=report(P.output("smoke", "plan.md"), caption="../report/plan.rst", category="Smoke"),
    params:
        script=script("smoke"),
        cfg=run_params("smoke"),
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
        "python -m kiln.train.launch --train {params.launch:q} -- {params.script} --params {params.cfg:q} --shards {input.shards}"
        " --tokenizer {input.tokenizer} --out {params.out} --threads {params.rank_threads} > {log} 2>&1"
