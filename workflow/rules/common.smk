# Helpers shared by the stage rules.

CONDA_ENV = "../../envs/kiln.yaml"  # relative to the .smk file that uses it


def script(stage):
    """The entry script of a stage (each also runs by hand: python workflow/scripts/<stage>.py --help)."""
    return SCRIPTS / f"{stage}.py"


def stage_params(stage):
    """The config sections `stage` reads, as canonical JSON: the rule's params, so a change to
    them (and only to them) reruns the stage."""
    return kiln_config.stage_params(config, stage)


def log_of(stage):
    return f"{RUN}/logs/{stage}.log"


def benchmark_of(stage):
    return f"{RUN}/benchmarks/{stage}.tsv"


def threads_per_rank(wildcards, threads):
    """torchrun sets OMP_NUM_THREADS=1 per process; give each rank its share of the job's cores."""
    return max(1, threads // config["train"]["nproc_per_node"])
