rule report:
    input:
        upstream("tokenizer", "stats.json"),
        upstream("shard"),
        rules.smoke.output.report,
        rules.plan.output.plan,
        rules.train.output.summary,
        rules.eval.output.metrics,
        rules.eval.output.samples,
    output:
        report=report(P.output("report", "report.md"), caption="../report/report_md.rst", category="Report"),
        plot=report(P.output("report", "loss.png"), caption="../report/loss.rst", category="Training"),
    params:
        script=script("report"),
        **stage_params("report"),
        results=lambda w: LAYOUTS[w.run].root,
    conda:
        CONDA_ENV
    log:
        P.log("report"),
    benchmark:
        P.benchmark("report")
    shell:
        "python {params.script} --params {params.cfg:q} --untracked {params.untracked:q} --results {params.results}"
        " --report {output.report} --plot {output.plot} > {log} 2>&1"
