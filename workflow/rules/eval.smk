rule eval:
    input:
        model=rules.train.output.model,
        shards=rules.shard.output.shards,
        tokens=rules.pretokenize.output.tokens,
        raw=rules.download.output.raw,
        tokenizer=rules.tokenizer.output.tokenizer,
    output:
        metrics=f"{RUN}/eval/metrics.json",
        samples=f"{RUN}/eval/samples.json",
    params:
        script=script("eval"),
        cfg=stage_params("eval"),
        model_dir=lambda w, input: Path(input.model).parent,
        out=lambda w, output: Path(output.metrics).parent,
    threads: 64
    resources:
        **rank_resources(ranks=False),
    conda:
        CONDA_ENV
    log:
        log_of("eval"),
    benchmark:
        benchmark_of("eval")
    shell:
        "python {params.script} --params {params.cfg:q} --model {params.model_dir} --shards {input.shards}"
        " --tokens {input.tokens} --raw {input.raw} --tokenizer {input.tokenizer} --out {params.out}"
        " > {log} 2>&1"
