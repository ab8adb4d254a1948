# Same launcher, model and parallelism as train: what passes here is what train will run.
# report.json is written only when the gate passes (or smoke.gate is false).
rule smoke:
    input:
        shards=rules.shard.output.shards,
        tokenizer=rules.tokenizer.output.tokenizer,
    output:
        report=f"{RUN}/smoke/report.json",
        plan=f"{RUN}/smoke/plan.json",
        plan_md=report(f"{RUN}/smoke/plan.md", caption="../report/plan.rst", category="Smoke"),
    params:
        script=script("smoke"),
        cfg=stage_params("smoke"),
        launch=launch_settings(),
        rank_threads=threads_per_rank,
        out=lambda w, output: Path(output.report).parent,
    threads: 64
    resources:
        **rank_resources(),
    conda:
        CONDA_ENV
    log:
        log_of("smoke"),
    benchmark:
        benchmark_of("smoke")
    shell:
        "python -m kiln.train.launch --train {params.launch:q} -- {params.script} --params {params.cfg:q} --shards {input.shards}"
        " --tokenizer {input.tokenizer} --out {params.out} --threads {params.rank_threads} > {log} 2>&1"
