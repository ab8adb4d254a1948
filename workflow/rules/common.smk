# Helpers shared by the stage rules.

import json

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


def launch_settings():
    """What kiln.train.launch needs to start the ranks (torchrun; srun across nodes), as JSON."""
    keys = ("nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint")
    return json.dumps({key: config["train"][key] for key in keys})


def rank_resources(ranks=True):
    """What a stage that runs on the training hardware asks a cluster for, read from train's settings
    (the one place they are set): train.nnodes nodes and train.nproc_per_node GPUs on each
    (`gres=gpu:N` is per node; the plugin's `gpu` would be a total), none when train.device is cpu.
    Partition, account, time and memory are the profile's (profiles/slurm). Several nodes: one task
    per node and the `mpi` resource, so the job's shell runs once, on the first node, where
    kiln.train.launch starts one srun task per node. `tasks_per_gpu=0` keeps the slurm plugin from
    turning `tasks` into --ntasks-per-gpu. ranks=False (eval): one process, on one node."""
    train = config["train"]
    nodes = train["nnodes"] if ranks else 1
    per_node = train["nproc_per_node"] if ranks else 1
    res = {"nodes": nodes, "tasks": nodes, "tasks_per_gpu": 0}
    if train["device"] != "cpu":
        res["gres"] = f"gpu:{per_node}"
    if nodes > 1:
        res["mpi"] = "srun"
    return res
