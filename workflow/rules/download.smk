rule download:
    output:
        raw=directory(f"{RUN}/raw"),
    params:
        script=script("download"),
        cfg=stage_params("download"),
    conda:
        CONDA_ENV
    log:
        log_of("download"),
    benchmark:
        benchmark_of("download")
    shell:
        "python {params.script} --params {params.cfg:q} --out {output.raw} > {log} 2>&1"
