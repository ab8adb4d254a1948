from kiln.train.launch import torchrun_command


# Same launcher, model and parallelism as train: what passes here is what train will run.
rule smoke:
    input:
        f"{RUN}/shards",
    output:
        f"{RUN}/smoke/report.json",
    params:
        script=script("smoke"),
        cfg=stage_params("smoke"),
        launcher=torchrun_command(config["train"]),
        rank_threads=threads_per_rank,
    threads: 64
    conda:
        CONDA_ENV
    log:
        log_of("smoke"),
    benchmark:
        benchmark_of("smoke")
    shell:
        "{params.launcher} {params.script} --params {params.cfg:q}"
        " --shards {input} --report {output} --threads {params.rank_threads} > {log} 2>&1"
