rule eval:
    input:
        model=rules.train.output.model,
        shards=upstream("shard"),
        tokens=upstream("pretokenize"),
        tokenizer=upstream("tokenizer", "tokenizer.json"),
        eval_data=rules.eval_data.output.data,
        task_data=rules.eval_data.output.tasks,
    output:
        metrics=P.output("eval", "metrics.json"),
        samples=P.output("eval", "samples.json"),
    params:
        script=script("eval"),
        **stage_params("eval"),
        model_dir=lambda w, input: Path(input.model).parent,
        out=lambda w, output: Path(output.metrics).parent,
        eval_data=lambda w, input: Path(input.eval_data).parent,
    threads: 64
    resources:
        **rank_resources(ranks=False),
    conda:
        CONDA_ENV
    log:
        P.log("eval"),
    benchmark:
        P.benchmark("eval")
    shell:
        "python {params.script} --params {params.tracked:q} --untracked {params.untracked:q} --model {params.model_dir} --shards {input.shards}"
        " --tokens {input.tokens} --tokenizer {input.tokenizer} --eval-data {params.eval_data} --out {params.out}"
        " > {log} 2>&1"
