rule shard:
    input:
        f"{RUN}/tokens",
    output:
        directory(f"{RUN}/shards"),
    params:
        cfg=stage_params("shard"),
    log:
        log_of("shard"),
    benchmark:
        benchmark_of("shard")
    shell:
        "python {SCRIPTS}/shard.py --params {params.cfg:q} --tokens {input} --out {output} > {log} 2>&1"
