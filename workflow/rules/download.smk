# The download stage is three kinds of job: a plan, one download_part job per share of the input
# files, and the download job that gathers them (kiln.data.raw_scatter). The plan is a checkpoint: it
# lists the sources' files (stdlib, local, an hf dataset's parquet data files), so it says how many part
# jobs there are.
checkpoint download_plan:
    output:
        plan=P.scatter_plan("download"),
    params:
        script=script("download_plan"),
        **stage_params("download", of="data"),
    conda:
        CONDA_ENV
    log:
        P.log("download", "download_plan"),
    benchmark:
        P.benchmark("download", "download_plan")
    shell:
        "python {params.script} --params {params.tracked:q} --untracked {params.untracked:q} --out {output.plan} > {log} 2>&1"


# The scatter: each job runs the order-free checks (UTF-8, size, quality filters, decontamination,
# hashes, MinHash) on its share, so a cluster profile spreads them over CPU nodes and --cores all
# over this machine's cores.
rule download_part:
    input:
        plan=P.scatter_plan("download"),
    output:
        part=temp(directory(P.part("download", "{part}"))),
    params:
        script=script("download_part"),
        **stage_params("download", of="data"),
    conda:
        CONDA_ENV
    log:
        P.log("download", "download_part", part="{part}"),
    benchmark:
        P.benchmark("download", "download_part", part="{part}")
    shell:
        "python {params.script} --params {params.tracked:q} --untracked {params.untracked:q} --plan {input.plan}"
        " --part {wildcards.part} --out {output.part} > {log} 2>&1"


# The gather: every source replayed in order through the ordered decisions (exact and near
# duplicates, budgets); hf streams that cannot be cut by file, and a budget's shares past its
# expected reach (should the budget reach them), are read here.
# The bytes one job would write.
rule download:
    input:
        plan=P.scatter_plan("download"),
        parts=scatter_parts("download"),
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
        "python {params.script} --params {params.tracked:q} --untracked {params.untracked:q} --plan {input.plan}"
        " --parts {input.parts} --out {output.raw} > {log} 2>&1"
