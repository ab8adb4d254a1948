rule pretokenize:
    input:
        raw=f"{RUN}/raw",
        tokenizer=f"{RUN}/tokenizer/tokenizer.json",
    output:
        directory(f"{RUN}/tokens"),
    params:
        script=script("pretokenize"),
        cfg=stage_params("pretokenize"),
    threads: 64
    conda:
        CONDA_ENV
    log:
        log_of("pretokenize"),
    benchmark:
        benchmark_of("pretokenize")
    shell:
        "python {params.script} --params {params.cfg:q} --raw {input.raw} --tokenizer {input.tokenizer}"
        " --out {output} --workers {threads} > {log} 2>&1"
