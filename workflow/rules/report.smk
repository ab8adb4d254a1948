rule report:
    input:
        rules.tokenizer.output.stats,
        rules.shard.output.shards,
        rules.smoke.output.report,
        rules.smoke.output.plan,
        rules.train.output.summary,
        rules.eval.output.metrics,
        rules.eval.output.samples,
    output:
        report=report(f"{RUN}/report.md", caption="../report/report_md.rst", category="Report"),
        plot=report(f"{RUN}/loss.png", caption="../report/loss.rst", category="Training"),
    params:
        script=script("report"),
        cfg=stage_params("report"),
        results=lambda w, output: Path(output.report).parent,
    conda:
        CONDA_ENV
    log:
        log_of("report"),
    benchmark:
        benchmark_of("report")
    shell:
        "python {params.script} --params {params.cfg:q} --results {params.results}"
        " --report {output.report} --plot {output.plot} > {log} 2>&1"
