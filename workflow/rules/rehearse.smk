# The run's GPU-side work at its real shapes and ranks on fake tensors (kiln.rehearse: `kiln rehearse`),
# from the config alone: no data and no GPU, seconds to a minute or two of one CPU. It fails naming the
# first phase that will not fit the card (plan.gpu) or not start, before smoke takes a GPU. Scheduled
# first (priority); under a cluster profile it runs where snakemake runs, the login node (localrules,
# in the Snakefile). Smoke takes it before its probe (workflow/rules/smoke.smk says why not as an input).
rule rehearse:
    output:
        rehearsal=P.output("rehearse"),
    params:
        script=script("rehearse"),
        **stage_params("rehearse"),
    priority: 100
    conda:
        CONDA_ENV
    log:
        P.log("rehearse"),
    benchmark:
        P.benchmark("rehearse")
    shell:
        "python {params.script} --params {params.tracked:q} --untracked {params.untracked:q} --run {wildcards.run}"
        " --out {output.rehearsal} > {log} 2>&1"
