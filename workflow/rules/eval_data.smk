# Eval's work on the data alone (the unigram baseline, the infilling problems, the local lm-eval
# tasks' data, the 13-gram contamination scan over the train split): it needs no model, so it runs
# beside smoke and train, on a CPU node under a cluster profile (no GPU asked for), and the eval job
# on the GPU node only runs the model.
rule eval_data:
    input:
        shards=upstream("shard"),
        tokens=upstream("pretokenize"),
        raw=upstream("download"),
        tokenizer=upstream("tokenizer", "tokenizer.json"),
    output:
        data=P.output("eval_data", "eval_data.json"),
        tasks=directory(P.output("eval_data", "lm_eval_tasks")),
    params:
        script=script("eval_data"),
        **stage_params("eval_data"),
        out=lambda w, output: Path(output.data).parent,
    threads: 1
    conda:
        CONDA_ENV
    log:
        P.log("eval_data"),
    benchmark:
        P.benchmark("eval_data")
    shell:
        "python {params.script} --params {params.tracked:q} --untracked {params.untracked:q} --shards {input.shards}"
        " --tokens {input.tokens} --raw {input.raw} --tokenizer {input.tokenizer} --out {params.out}"
        " > {log} 2>&1"
