# Reads the smoke report so that train never starts unless the smoke gate passed.
rule train:
    input:
        shards=f"{RUN}/shards",
        smoke=f"{RUN}/smoke/report.json",
    output:
        model=f"{RUN}/train/model.safetensors",
        model_config=f"{RUN}/train/model_config.json",
        summary=f"{RUN}/train/summary.json",
    params:
        script=script("train"),
        cfg=stage_params("train"),
        nproc=config["train"]["nproc_per_node"],
        rank_threads=threads_per_rank,
        out=lambda w, output: Path(output.model).parent,
    threads: 64
    conda:
        CONDA_ENV
    log:
        log_of("train"),
    benchmark:
        benchmark_of("train")
    shell:
        "torchrun --standalone --nproc_per_node={params.nproc} {params.script} --params {params.cfg:q}"
        " --shards {input.shards} --out {params.out} --threads {params.rank_threads} > {log} 2>&1"
