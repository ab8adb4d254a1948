# Not part of `all`: run it on demand (snakemake --cores 1 verify), e.g. after copying shards. Each
# shard folder's report lands beside it: results/data/shards-<key>.verified.json.
rule verify_shards:
    input:
        shards=P.output("shard"),
    output:
        P.verified(),
    params:
        script=script("shard"),
        **stage_params("shard", of="data"),
    conda:
        CONDA_ENV
    log:
        P.log("shard", "verify"),
    benchmark:
        P.benchmark("shard", "verify")
    shell:
        "python {params.script} --params {params.tracked:q} --untracked {params.untracked:q} --verify --out {input.shards} --report {output} > {log} 2>&1"


rule verify:
    input:
        sorted({layout.verified() for layout in LAYOUTS.values()}),
