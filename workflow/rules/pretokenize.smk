rule pretokenize:
    input:
        raw=upstream("download", of="pretokenize"),
        tokenizer=upstream("tokenizer", "tokenizer.json", of="pretokenize"),
    output:
        tokens=directory(P.output("pretokenize")),
    params:
        script=script("pretokenize"),
        **stage_params("pretokenize", of="data"),
    threads: 64
    conda:
        CONDA_ENV
    log:
        P.log("pretokenize"),
    benchmark:
        P.benchmark("pretokenize")
    shell:
        "python {params.script} --params {params.tracked:q} --untracked {params.untracked:q} --raw {input.raw} --tokenizer {input.tokenizer}"
        " --out {output.tokens} --workers {threads} > {log} 2>&1"
