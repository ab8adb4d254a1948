rule shard:
    input:
        tokens=rules.pretokenize.output.tokens,
    output:
        shards=directory(f"{RUN}/shards"),
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
        "python {params.script} --params {params.cfg:q} --tokens {input.tokens} --out {output.shards} > {log} 2>&1"
