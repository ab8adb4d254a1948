"""train stage: the full run. Launch under torchrun (one process per device; gloo on CPU).

Writes into --out: metrics.jsonl (one JSON object per log step; wandb/ too unless wandb.mode is
disabled), samples.jsonl (completions of train.samples.prompts at every validation, sampled or greedy as each row says;
with eval.in_loop.every, HumanEval pass@1 in metrics.jsonl's validation records: kiln.eval.in_loop),
checkpoints/ (resumable: a rerun with the same training settings continues from the newest complete one,
and a finished run's trains 0 steps; one with other settings, or with --forcerun train, sets them aside
under superseded/ and starts over), final-summary.json (summary.json as the run that trained wrote it), and at the end
model.safetensors + model_config.json, summary.json, and hf/: the model in Hugging Face format
(config.json, model.safetensors, tokenizer files) for `AutoModelForCausalLM.from_pretrained`.
"""

import dataclasses
from pathlib import Path

import torch

from kiln import hf, layout
from kiln.data.shards import check_tokenizer
from kiln.errors import KilnError
from kiln.io import read_json, write_json
from kiln.model.build import load_model
from kiln.plan.steps import TrainPlan
from kiln.plan.verdict import SmokeReport
from kiln.stage import run_main, stage_config, stage_parser
from kiln.train import init_from
from kiln.train.budget import final_summary
from kiln.train.callbacks import default_callbacks
from kiln.train.samples import train_sampler
from kiln.train.trainer import run


def in_loop_evals(tokenizer: Path, config) -> list:
    """eval.in_loop's HumanEval callback when it is on; imported only then (kiln.eval.in_loop)."""
    if not config.eval.in_loop.every:
        return []
    from kiln.eval.in_loop import HumanEvalInLoop

    return [HumanEvalInLoop(tokenizer, config.eval)]


def main() -> None:
    parser = stage_parser("train", __doc__)
    parser.add_argument("--shards", required=True, type=Path, help="shard stage output folder")
    parser.add_argument(
        "--smoke",
        type=Path,
        help="smoke stage's report.json: train refuses to start unless it passed, and plans its steps (a "
        "budget's, or train.max_steps) and precision from its measurements",
    )
    parser.add_argument("--tokenizer", required=True, type=Path, help="tokenizer stage's tokenizer.json")
    parser.add_argument("--out", required=True, type=Path, help="output folder, e.g. results/<run>/train")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads per rank (0: torch default)")
    args = parser.parse_args()
    config = stage_config(args, "train")
    smoke = SmokeReport.load(args.smoke) if args.smoke is not None else None
    if smoke is not None:  # first: a failed gate says so before anything else is read
        smoke.require_passed()
    check_tokenizer(args.shards, args.tokenizer)  # the one the Hugging Face export will carry
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    plan = None
    if smoke is not None and smoke.measurements is not None:  # the plan stage's figures, less its prints
        price = config.smoke.price_per_gpu_hour
        plan = TrainPlan.of(smoke.measurements.plan(config.train, price), str(args.smoke))
    train = config.train
    if plan is not None:  # the probe's precision, micro-batch and checkpointing (auto's picks)
        train = plan.applied(train)
    elif train.max_steps is None:
        raise KilnError("train.budget: train needs the smoke stage's measurements (--smoke) to know its steps")
    train = init_from.resolved_warmup(train, args.out.parents[1])  # results/<run>/train
    result = run(
        config.replace(train=train),
        args.shards,
        args.out,
        max_steps=plan.max_steps if plan else None,
        budget=plan.budget if plan else None,  # re-planned as the run goes (kiln.train.budget)
        callbacks=default_callbacks(train_sampler(args.tokenizer, train), in_loop_evals(args.tokenizer, config)),
    )
    if result.is_main:
        hf.export(load_model(args.out), args.out / "hf", args.tokenizer)
        final = args.out / layout.FINAL_SUMMARY
        if result.start_step == result.steps and final.is_file():  # a finished run of these settings
            print(
                f"train: the run there finished at step {result.steps} with these settings: nothing to train, "
                "its weights and summary kept (`snakemake --forcerun train` trains again)",
                flush=True,
            )
            summary = read_json(final)
        else:
            summary = dataclasses.asdict(result)
            if (
                result.budget is not None
            ):  # budget_s, spent_s (to here: all but the exit), planned/final steps, decisions
                summary |= final_summary(summary.pop("budget"))
            write_json(final, summary)
        write_json(args.out / "summary.json", summary)
        print(
            f"train: {result.steps} steps, {result.tokens_seen} tokens, {result.tokens_per_s:.0f} tok/s -> {args.out}"
        )


if __name__ == "__main__":
    run_main(main)
