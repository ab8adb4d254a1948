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
        cfg=stage_params("train"),
        nproc=config["train"]["nproc_per_node"],
        rank_threads=threads_per_rank,
        out=f"{RUN}/train",
    threads: 64
    log:
        log_of("train"),
    benchmark:
        benchmark_of("train")
    shell:
        "torchrun --standalone --nproc_per_node={params.nproc} {SCRIPTS}/train.py --params {params.cfg:q}"
        " --shards {input.shards} --out {params.out} --threads {params.rank_threads} > {log} 2>&1"
