"""smoke stage: the gate before the full run. Launch it the way train is launched (torchrun): same
model, batch and parallelism.

First the rehearsal of the run's settings (kiln.rehearse): the rehearse rule's rehearsal.json when it
rehearsed these settings, else the train side's phases rehearsed here on fake tensors (seconds of CPU;
the eval stage's batches are the rule's); a phase that will not fit plan.gpu stops the stage before
the probe spends the GPU's time.

Runs the checks of kiln.gate.checks (preflight, causality, init loss, health, generalisation, data,
overfit), each against its threshold in the `smoke` section, and prints them as a table; with
eval.in_loop on, first the sandbox its programs will run in (in_loop_sandbox). When all
pass (or smoke.gate is false) it writes report.json: the checks and the measurements (speed, stage
times, the precision train.precision auto picks), from which train plans its steps and the plan
stage (workflow/scripts/plan.py) the full run's time and cost. When one fails and the gate is on, it
writes nothing the train rule would take and exits non-zero, naming the checks that failed.
"""

import os
from pathlib import Path

import torch

from kiln import config as kiln_config
from kiln.config import settings
from kiln.config.run_config import RunConfig
from kiln.data.shards import check_tokenizer
from kiln.data.tokenizer import load_tokenizer, role_id
from kiln.errors import KilnError, RanksOutOfMemory
from kiln.gate.checks import run_checks
from kiln.io import read_json
from kiln.plan.tables import checks_table
from kiln.plan.verdict import Check, Measurements, SmokeReport
from kiln.rehearse.run import current_or_rehearsed
from kiln.stage import config_of, run_main, stage_config, stage_parser
from kiln.train.distributed import shutdown


def in_loop_sandbox(config) -> list[Check]:
    """With eval.in_loop on, the train stage refuses before its first step where the sandbox cannot
    confine the eval's programs: asked the same here (kiln.eval.in_loop.require_sandbox), before the
    probe spends any GPU time, it stops this stage with that KilnError, whatever smoke.gate says (train
    would refuse anyway). Where it can, the gate's report says how. Imported only when on, as train does."""
    if not config.eval.in_loop.every:
        return []
    from kiln.eval.in_loop import require_sandbox

    return [Check("sandbox", True, require_sandbox(), "eval.in_loop's programs confined (namespaces)")]


def main() -> None:
    parser = stage_parser("smoke", __doc__)
    parser.add_argument("--shards", required=True, type=Path, help="shard stage output folder")
    parser.add_argument(
        "--tokenizer", type=Path, help="tokenizer stage's tokenizer.json: the overfit check then takes FIM rows first"
    )
    parser.add_argument("--out", required=True, type=Path, help="output folder, e.g. results/<run>/smoke")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads per rank (0: torch default)")
    parser.add_argument(
        "--rehearsal", type=Path, help="the rehearse stage's rehearsal.json, taken if it rehearsed these settings"
    )
    parser.add_argument("--rehearse-params", help="with --params: the rehearse stage's params, as Snakemake gives them")
    parser.add_argument("--rehearse-untracked", default="{}", help="with --rehearse-params: the rest of its sections")
    args = parser.parse_args()
    config = stage_config(args, "smoke")
    rehearsed(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tokenizer:
        check_tokenizer(args.shards, args.tokenizer)
    marker = role_id(load_tokenizer(args.tokenizer), "<fim_middle>") if args.tokenizer else None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    sandbox = in_loop_sandbox(config)  # every rank, as train's; before any process group
    try:
        report = run_checks(config, args.shards, args.out, marker_id=marker)
    except BaseException:
        shutdown()
        raise
    checks = report.pop("checks") + sandbox
    train, smoke = config.train, config.smoke
    rank0 = int(os.environ.get("RANK", "0")) == 0  # rank 0 reports for all
    preflight = checks[0]
    if not preflight.passed and (smoke.gate or world > 1):
        # Out of memory on a rank. Every rank ends with this error, at once: with several, one has
        # exited or is about to, and a collective (the barrier of a synced shutdown) would wait for it.
        if rank0:
            print(checks_table(checks))
        raise RanksOutOfMemory(f"smoke: preflight FAILED: {preflight.figure}. {preflight.detail}")
    shutdown(synced=True)  # (a rank that exits right after its last collective can hang)
    if not rank0:
        return
    print(checks_table(checks))
    measured = Measurements.from_dict(report) if report else None
    verdict = SmokeReport.judge(checks, measured, enforce=smoke.gate)
    verdict.require_passed()
    if measured is None and train.budget:
        raise KilnError(
            "train.budget: the smoke probe did not run, so there is no speed to turn the budget into "
            "steps; fix the failed checks (or set train.max_steps)"
        )
    verdict.save(args.out / "report.json")  # last: train waits on this file
    print(f"smoke: {verdict.summary} -> {args.out}")


def rehearsed(args) -> None:
    """The rehearsal of this run's settings, passed (kiln.rehearse.run.current_or_rehearsed): its
    settings from the rehearse stage's params under Snakemake, from the config file by hand."""
    if args.config:
        whole = kiln_config.load(args.config)
        tracked, run = settings.tracked(whole, "rehearse"), RunConfig.of(settings.stage_config(whole, "rehearse"))
    elif args.rehearse_params:
        tracked, run = args.rehearse_params, config_of(args.rehearse_params, args.rehearse_untracked)
    else:
        return  # a smoke stage given only its own sections (its tests): nothing to rehearse from
    # the vocabulary the tokenizer stage made, as the shards hold it (the rule predicts the same)
    vocab = read_json(args.shards / "manifest.json")["padded_vocab_size"]
    current_or_rehearsed(args.rehearsal, run, vocab, tracked)


if __name__ == "__main__":
    run_main(main)
