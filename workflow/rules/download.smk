rule download:
    output:
        directory(f"{RUN}/raw"),
    params:
        cfg=stage_params("download"),
    log:
        log_of("download"),
    benchmark:
        benchmark_of("download")
    shell:
        "python {SCRIPTS}/download.py --params {params.cfg:q} --out {output} > {log} 2>&1"
