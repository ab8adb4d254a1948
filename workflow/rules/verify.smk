# Not part of `all`: run it on demand (snakemake --cores 1 verify), e.g. after copying shards.
rule verify:
    input:
        shards=rules.shard.output.shards,
    output:
        f"{RUN}/shards.verified.json",
    params:
        script=script("shard"),
        cfg=stage_params("shard"),
    conda:
        CONDA_ENV
    log:
        log_of("verify"),
    benchmark:
        benchmark_of("verify")
    shell:
        "python {params.script} --params {params.cfg:q} --verify --out {input.shards} --report {output} > {log} 2>&1"
