# The pretokenize stage is three kinds of job: a plan, one part job per raw part, a gather.
# The plan is a checkpoint: it says how many raw parts there are, so how many part jobs. (After the
# tokenizer, not on the download: `--until tokenizer` would otherwise find nothing to do, snakemake
# issue 2824 for rules between a checkpoint and its aggregation.)
checkpoint pretokenize_plan:
    input:
        raw=upstream("download", of="pretokenize"),
        tokenizer=upstream("tokenizer", "tokenizer.json", of="pretokenize"),
    output:
        plan=P.scatter_plan("pretokenize"),
    params:
        script=script("pretokenize_plan"),
        **stage_params("pretokenize", of="data"),
    conda:
        CONDA_ENV
    log:
        P.log("pretokenize", "pretokenize_plan"),
    benchmark:
        P.benchmark("pretokenize", "pretokenize_plan")
    shell:
        "python {params.script} --params {params.tracked:q} --untracked {params.untracked:q} --raw {input.raw}"
        " --tokenizer {input.tokenizer} --out {output.plan} > {log} 2>&1"


# The scatter: one job per raw part encodes it whole (kiln.data.pretokenize.pretokenize_part), so a
# cluster profile spreads the encoding over many CPU nodes and --cores all over this machine's cores.
rule pretokenize_part:
    input:
        raw=upstream("download", of="pretokenize"),
        tokenizer=upstream("tokenizer", "tokenizer.json", of="pretokenize"),
        plan=P.scatter_plan("pretokenize"),
    output:
        part=temp(directory(P.part("pretokenize", "{part}"))),
    params:
        script=script("pretokenize_part"),
        **stage_params("pretokenize", of="data"),
    conda:
        CONDA_ENV
    log:
        P.log("pretokenize", "pretokenize_part", part="{part}"),
    benchmark:
        P.benchmark("pretokenize", "pretokenize_part", part="{part}")
    shell:
        "python {params.script} --params {params.tracked:q} --untracked {params.untracked:q} --raw {input.raw}"
        " --tokenizer {input.tokenizer} --part {wildcards.part} --out {output.part} > {log} 2>&1"


# The gather: the validation split picked across the parts, the train side cut at the budgets, the
# bytes one job would write; the part folders are deleted once it has run.
rule pretokenize:
    input:
        raw=upstream("download", of="pretokenize"),
        tokenizer=upstream("tokenizer", "tokenizer.json", of="pretokenize"),
        parts=scatter_parts("pretokenize"),
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
        " --parts {input.parts} --out {output.tokens} --workers {threads} > {log} 2>&1"
