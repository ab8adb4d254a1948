rule shard:
    input:
        tokens=upstream("pretokenize", of="shard"),
    output:
        shards=directory(P.output("shard")),
    params:
        script=script("shard"),
        **stage_params("shard", of="data"),
    conda:
        CONDA_ENV
    log:
        P.log("shard"),
    benchmark:
        P.benchmark("shard")
    shell:
        "python {params.script} --params {params.tracked:q} --untracked {params.untracked:q} --tokens {input.tokens} --out {output.shards} > {log} 2>&1"
