# Reads the smoke report so that train never starts unless the smoke gate passed, and plans its steps
# from its measurements (a budget's, or train.max_steps; not the plan rule's prices). Ends with a
# Hugging Face export (train/hf: weights, config, tokenizer) that transformers loads as it is.
# metrics.jsonl, samples.jsonl and checkpoints/ are not declared outputs on purpose: Snakemake
# deletes a job's outputs before rerunning it, and a killed run resumes from them (a rerun whose
# training settings changed, or of a finished run, sets them aside and starts over: kiln.train.trainer).
# The shell execs the launcher: Slurm's preemption signal reaches every process of the job step, and
# a shell left in between would die of it at once, ending the job while the ranks still save.
# Under a cluster executor a preempted job (exit 75) is resubmitted up to train.max_resubmits times
# (resubmit_preempted_train, from the Snakefile's onstart); the launcher gets the attempt (the
# kiln_attempt resource: Snakemake hands `attempt` to resource functions only) and train/jobs.jsonl,
# and a resubmission after any other failure exits at once (kiln.train.launch).
rule train:
    input:
        shards=upstream("shard"),
        smoke=rules.smoke.output.report,
        tokenizer=upstream("tokenizer", "tokenizer.json"),
        init=init_source,
    output:
        model=P.output("train", "model.safetensors"),
        model_config=P.output("train", "model_config.json"),
        summary=P.output("train", "summary.json"),
        hf=directory(P.output("train", "hf")),
    params:
        script=script("train"),
        **stage_params("train"),
        launch=launch_settings,
        rank_threads=threads_per_rank,
        out=lambda w, output: Path(output.model).parent,
        resubmits=max_resubmits,
        jobs=lambda w: Path(LAYOUTS[w.run].folder("train")) / kiln_layout.TRAIN_JOBS,
    threads: 64
    resources:
        **rank_resources(),
        mem_mb=train_memory_mb,
        kiln_attempt=lambda w, attempt: attempt,
    conda:
        CONDA_ENV
    log:
        P.log("train"),
    benchmark:
        P.benchmark("train")
    shell:
        "exec python -m kiln.train.launch --train {params.launch:q} --attempt {resources.kiln_attempt}"
        " --max-resubmits {params.resubmits} --record {params.jobs:q} --log {log:q} -- {params.script} --params {params.tracked:q} --untracked {params.untracked:q}"
        " --shards {input.shards} --smoke {input.smoke} --tokenizer {input.tokenizer} --out {params.out}"
        " --threads {params.rank_threads} > {log} 2>&1"

