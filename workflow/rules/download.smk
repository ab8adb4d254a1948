rule download:
    output:
        raw=directory(P.output("download")),
    params:
        script=script("download"),
        cfg=data_params("download"),
    conda:
        CONDA_ENV
    log:
        P.log("download"),
    benchmark:
        P.benchmark("download")
    shell:
        "python {params.script} --params {params.cfg:q} --out {output.raw} > {log} 2>&1"
