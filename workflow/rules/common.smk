# Helpers shared by the stage rules. Every path comes from kiln.layout: P holds the rules' patterns,
# {run} for a run's own stages and {key} for a shared data stage's content key; LAYOUTS[run] a
# run's concrete paths, DATA[(stage, key)] the config that a data stage's key stands for.

import json
import re
import sys

CONDA_ENV = "../../envs/kiln.yaml"  # relative to the .smk file that uses it
P = kiln_layout.Layout.pattern()
DATA = {(stage, layout.keys[stage]): RUNS[run] for run, layout in LAYOUTS.items() for stage in kiln_layout.DATA_STAGES}


wildcard_constraints:
    run="|".join(re.escape(run) for run in RUNS),
    key="[0-9a-f]{%d}" % kiln_layout.KEY_CHARS,
    part="[0-9]+",


for _run, _layout in LAYOUTS.items():  # data folders an older Kiln kept in the run folder
    if (_found := kiln_layout.legacy_data(_layout.run_dir)):
        print(f"Kiln: {kiln_layout.legacy_message(_layout.run_dir, _found, _layout)}", file=sys.stderr)


def script(stage):
    """The entry script of a stage (each also runs by hand: python workflow/scripts/<stage>.py --help)."""
    return SCRIPTS / f"{stage}.py"


def stage_params(stage, of="run"):
    """A rule's two config params (kiln.config.settings): `cfg`, the settings that change the stage's
    outputs, as canonical JSON, which Snakemake compares, so a change to one of them (and only to
    them) reruns the stage; `untracked`, the rest of the sections the stage reads (logging, cadence,
    placement, retries), as a value Snakemake does not compare. The script joins the two. For a run's
    stage (of="run") or a shared data stage (of="data"), from the config its key stands for."""
    config_of = (lambda w: RUNS[w.run]) if of == "run" else (lambda w: DATA[(stage, w.key)])
    return {
        "tracked": lambda w: kiln_settings.tracked(config_of(w), stage),
        "untracked": lambda w: kiln_settings.untracked(config_of(w), stage),
    }


def upstream(stage, name=None, of="run"):
    """An input: `stage`'s output (or its output `name`) for this job's run (of="run") or for the
    data key of the job's own data stage (of=<that stage>)."""
    if of == "run":
        return lambda wildcards: LAYOUTS[wildcards.run].output(stage, name)
    return lambda wildcards: kiln_layout.Layout(DATA[(of, wildcards.key)]).output(stage, name)


def scatter_parts(stage):
    """A scattered stage's gather inputs: its part job folders, as many as its plan counts. The plan
    is a checkpoint: until it has run, Snakemake waits on it, then asks again."""
    plan_job = kiln_layout.SCATTER_JOBS[stage][0]

    def parts(wildcards):
        plan = kiln_layout.ScatterPlan.load(getattr(checkpoints, plan_job).get(key=wildcards.key).output.plan)
        layout = kiln_layout.Layout(DATA[(stage, wildcards.key)])
        return [layout.part(stage, index) for index in range(plan.parts)]

    return parts


def sweep_outputs():
    """The sweep's overlay report (workflow/rules/sweep.smk), when this config is a sweep."""
    return list(kiln_layout.sweep_outputs(SWEEP).values()) if SWEEP else []


def init_source(wildcards):
    """What train.init_from reads (another run's final weights, a checkpoint or an HF export), so the
    run waits for it and reruns when it changes; nothing for a run from a random init."""
    return kiln_layout.init_input(RUNS[wildcards.run]["train"]["init_from"])


def threads_per_rank(wildcards, threads):
    """torchrun sets OMP_NUM_THREADS=1 per process; give each rank its share of the job's cores
    (untracked: how many ranks run a stage never reruns it)."""
    return kiln_settings.Untracked(str(max(1, threads // RUNS[wildcards.run]["train"]["nproc_per_node"])))


def launch_settings(wildcards):
    """What kiln.train.launch needs to start the ranks (torchrun; srun across nodes), as JSON
    (untracked, as the ranks are)."""
    keys = ("nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint")
    return kiln_settings.Untracked(json.dumps({key: RUNS[wildcards.run]["train"][key] for key in keys}))


def max_resubmits(wildcards):
    """train.max_resubmits, for the launcher (untracked: a retry bound reruns nothing)."""
    return kiln_settings.Untracked(str(RUNS[wildcards.run]["train"]["max_resubmits"]))


def rank_resources(ranks=True):
    """What a stage that runs on the training hardware asks a cluster for, read from the run's train
    settings (the one place they are set): train.nnodes nodes and train.nproc_per_node GPUs on each
    (`gres=gpu:N` is per node; the plugin's `gpu` would be a total), none when train.device is cpu.
    Partition, account, time and memory are the profile's (profiles/slurm). Several nodes: one task
    per node and the `mpi` resource, so the job's shell runs once, on the first node, where
    kiln.train.launch starts one srun task per node. `tasks_per_gpu=0` keeps the slurm plugin from
    turning `tasks` into --ntasks-per-gpu. ranks=False (eval): one process, on one node. Each a
    function of the job's run, so every arm of a sweep asks for its own."""

    def nodes(wildcards):
        return RUNS[wildcards.run]["train"]["nnodes"] if ranks else 1

    def gres(wildcards):
        train = RUNS[wildcards.run]["train"]
        return "" if train["device"] == "cpu" else f"gpu:{train['nproc_per_node'] if ranks else 1}"

    def mpi(wildcards):
        return "srun" if nodes(wildcards) > 1 else ""

    return {"nodes": nodes, "tasks": nodes, "tasks_per_gpu": 0, "gres": gres, "mpi": mpi}


# mem_mb of a train job whose smoke report has no host-memory figure (an older report): the profile's
# figure for a GPU node before the smoke stage measured one.
UNMEASURED_TRAIN_MEM_MB = 64000


def train_memory_mb(wildcards, input):
    """mem_mb of a train job (per node): its ranks' host memory as the smoke stage measured it on the
    same hardware, compile workers included (TORCHINDUCTOR_COMPILE_THREADS per rank: kiln.train.launch),
    with headroom (kiln.plan.verdict.Measurements.node_memory_mb). A profile's set-resources still wins.
    Before the smoke stage ran (a dry run), Snakemake shows it as <TBD>: the FileNotFoundError of an
    input is how it learns that."""
    if not Path(input.smoke).is_file():
        raise FileNotFoundError(2, "the smoke report is not made yet", input.smoke)
    measured = SmokeReport.load(input.smoke).measurements
    ranks = RUNS[wildcards.run]["train"]["nproc_per_node"]
    return (measured and measured.node_memory_mb(ranks)) or UNMEASURED_TRAIN_MEM_MB


def tokenizer_memory_mb(wildcards):
    """mem_mb of a tokenizer job: what training on its train_bytes needs, from the fit of
    docs/benchmarks.md "The tokenizer at seed scale", with headroom (kiln.data.tokenizer_build.training_memory_mb), so a 2 GB sample is not cut off at the
    profile's default. A profile's set-resources still wins."""
    return training_memory_mb(RunConfig.of(DATA[("tokenizer", wildcards.key)]).tokenizer)


def resubmit_preempted_train():
    """Let Snakemake resubmit a failed train job, up to the largest train.max_resubmits of the runs
    (each run's own bound is the launcher's), when it submits jobs to a cluster: a job cut off by its
    time limit saved and exited 75, and the resubmission resumes from that checkpoint. Set from
    onstart, the first point where the executor is known (not at parse time, so not the rule's
    `retries:` directive); onstart runs only in the main process (spawned jobs get --no-hooks and
    --retries 0: a job never retries inside its own allocation). A local run is not resubmitted: a
    preemption there is someone's kill."""
    if workflow.non_local_exec:
        workflow.get_rule("train").restart_times = max(cfg["train"]["max_resubmits"] for cfg in RUNS.values())


def request_forced_retrains():
    """Ask each train job Snakemake was told to force (--forcerun train, -F, -f on its output) to
    train again from step 0 (kiln.layout.RETRAIN). Any other rerun of train (an input rewritten with
    the same content, a smoke stage redone for a gate setting, a deleted export) keeps a finished run
    whose fingerprint matches: 0 steps, the same weights. From onstart: the DAG is built there, and
    it runs in the main process only. A job Snakemake was told to force but that a forced stage above
    it reruns anyway has the upstream job as its reason, not the force (`--forcerun smoke train`), so
    the forced rules are asked too; files forced as incomplete (--rerun-incomplete) are not a force to
    retrain: a killed run resumes."""
    dag = workflow.dag
    for job in dag.needrun_jobs():
        forced = dag.reason(job).forced or (job.rule in dag.forcerules and job not in dag.omitforce)
        if job.rule.name == "train" and forced:
            kiln_layout.request_retrain(LAYOUTS[job.wildcards.run].folder("train"))


def _until_jobs_make_their_outputs():
    """Work around snakemake issue 2824 (open in 9.27): after a checkpoint updates the DAG, a job
    named by --until counts as needed only for the outputs that its dependents read, and --until cut
    those off, so `--until pretokenize` found nothing to do. Snakemake treats a job of a target rule as
    needed when any of its outputs is missing; the jobs --until names become such targets too."""
    import snakemake.dag

    set_until_jobs = getattr(snakemake.dag.DAG, "set_until_jobs", None)
    if set_until_jobs is None:  # another Snakemake: tests/dag/test_pipeline.py says whether it needs this
        return

    def patched(dag):
        set_until_jobs(dag)
        if dag.untilrules or dag.untilfiles:
            dag.targetrules = set(dag.targetrules) | {job.rule for job in dag.targetjobs}

    snakemake.dag.DAG.set_until_jobs = patched


_until_jobs_make_their_outputs()
