rule download:
    output:
        raw=directory(P.output("download")),
    params:
        script=script("download"),
        **stage_params("download", of="data"),
    conda:
        CONDA_ENV
    log:
        P.log("download"),
    benchmark:
        P.benchmark("download")
    shell:
        "python {params.script} --params {params.tracked:q} --untracked {params.untracked:q} --out {output.raw} > {log} 2>&1"
