rule eval:
    input:
        model=f"{RUN}/train/model.safetensors",
        shards=f"{RUN}/shards",
        tokens=f"{RUN}/tokens",
        raw=f"{RUN}/raw",
        tokenizer=f"{RUN}/tokenizer/tokenizer.json",
    output:
        metrics=f"{RUN}/eval/metrics.json",
        samples=f"{RUN}/eval/samples.json",
    params:
        cfg=stage_params("eval"),
        model_dir=f"{RUN}/train",
        out=f"{RUN}/eval",
    threads: 64
    log:
        log_of("eval"),
    benchmark:
        benchmark_of("eval")
    shell:
        "python {SCRIPTS}/eval.py --params {params.cfg:q} --model {params.model_dir} --shards {input.shards}"
        " --tokens {input.tokens} --raw {input.raw} --tokenizer {input.tokenizer} --out {params.out}"
        " > {log} 2>&1"
