rule shard:
    input:
        f"{RUN}/tokens",
    output:
        directory(f"{RUN}/shards"),
    params:
        script=script("shard"),
        cfg=stage_params("shard"),
    conda:
        CONDA_ENV
    log:
        log_of("shard"),
    benchmark:
        benchmark_of("shard")
    shell:
        "python {params.script} --params {params.cfg:q} --tokens {input} --out {output} > {log} 2>&1"
