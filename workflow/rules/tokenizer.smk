rule tokenizer:
    input:
        raw=rules.download.output.raw,
    output:
        tokenizer=f"{RUN}/tokenizer/tokenizer.json",
        stats=f"{RUN}/tokenizer/stats.json",
    params:
        script=script("tokenizer"),
        cfg=stage_params("tokenizer"),
    threads: 64
    conda:
        CONDA_ENV
    log:
        log_of("tokenizer"),
    benchmark:
        benchmark_of("tokenizer")
    shell:
        "RAYON_NUM_THREADS={threads} python {params.script} --params {params.cfg:q} --raw {input.raw}"
        " --tokenizer {output.tokenizer} --stats {output.stats} > {log} 2>&1"
