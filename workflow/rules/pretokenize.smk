rule pretokenize:
    input:
        raw=f"{RUN}/raw",
        tokenizer=f"{RUN}/tokenizer/tokenizer.json",
    output:
        directory(f"{RUN}/tokens"),
    params:
        cfg=stage_params("pretokenize"),
    threads: 64
    log:
        log_of("pretokenize"),
    benchmark:
        benchmark_of("pretokenize")
    shell:
        "RAYON_NUM_THREADS={threads} python {SCRIPTS}/pretokenize.py --params {params.cfg:q}"
        " --raw {input.raw} --tokenizer {input.tokenizer} --out {output} > {log} 2>&1"
