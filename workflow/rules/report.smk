rule report:
    input:
        raw=upstream("download"),
        tokenizer=upstream("tokenizer", "stats.json"),
        tokens=upstream("pretokenize"),
        shards=upstream("shard"),
        smoke=rules.smoke.output.report,
        plan=rules.plan.output.plan,
        train=rules.train.output.summary,
        metrics=rules.eval.output.metrics,
        samples=rules.eval.output.samples,
    output:
        report=report(P.output("report", "report.md"), caption="../report/report_md.rst", category="Report"),
        plot=report(P.output("report", "loss.png"), caption="../report/loss.rst", category="Training"),
    params:
        script=script("report"),
        **stage_params("report"),
        eval=lambda w, input: Path(input.metrics).parent,
    conda:
        CONDA_ENV
    log:
        P.log("report"),
    benchmark:
        P.benchmark("report")
    shell:
        "python {params.script} --params {params.tracked:q} --untracked {params.untracked:q} --raw {input.raw} --tokenizer-stats {input.tokenizer}"
        " --tokens {input.tokens} --shards {input.shards} --smoke {input.smoke} --plan {input.plan} --train {input.train}"
        " --eval {params.eval}"
        " --report {output.report} --plot {output.plot} > {log} 2>&1"
