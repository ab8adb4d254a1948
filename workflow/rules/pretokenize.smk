rule pretokenize:
    input:
        raw=rules.download.output.raw,
        tokenizer=rules.tokenizer.output.tokenizer,
    output:
        tokens=directory(f"{RUN}/tokens"),
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
        " --out {output.tokens} --workers {threads} > {log} 2>&1"
