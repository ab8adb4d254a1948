rule tokenizer:
    input:
        raw=upstream("download", of="tokenizer"),
    output:
        tokenizer=P.output("tokenizer", "tokenizer.json"),
        stats=P.output("tokenizer", "stats.json"),
    params:
        script=script("tokenizer"),
        **stage_params("tokenizer", of="data"),
    threads: 64
    resources:
        mem_mb=tokenizer_memory_mb,
    conda:
        CONDA_ENV
    log:
        P.log("tokenizer"),
    benchmark:
        P.benchmark("tokenizer")
    shell:
        "RAYON_NUM_THREADS={threads} python {params.script} --params {params.tracked:q} --untracked {params.untracked:q} --raw {input.raw}"
        " --tokenizer {output.tokenizer} --stats {output.stats} > {log} 2>&1"
