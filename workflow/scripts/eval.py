"""eval stage: held-out loss, perplexity and bits per byte (against a unigram baseline), completions
of fixed prompts (eval.prompts, and train.samples' prompts from the final model), FIM infilling
(single/multi-line, PSM/SPM; not for a model trained without FIM), lm-eval tasks, HumanEval pass@k and
HumanEval-Infilling pass@1 (every program run in kiln.eval.sandbox; eval.humaneval, eval.humaneval_infill),
and the 13-gram contamination the eval_data stage measured (its folder: --eval-data).

Writes eval/metrics.json and eval/samples.json (kiln.eval.metrics.output; and lm-eval's local task files under eval/). The
model runs where train ran (train.device): on a GPU under train.precision's autocast, else on the CPU
in fp32.
"""

import logging
from pathlib import Path

from kiln.eval.context import RunPaths
from kiln.eval.suite import evaluate
from kiln.stage import run_main, stage_config, stage_parser
from kiln.train.device import configure, select_device
from kiln.train.samples import train_sampler


def main() -> None:
    parser = stage_parser("eval", __doc__)
    parser.add_argument("--model", required=True, type=Path, help="train stage output folder")
    parser.add_argument("--shards", required=True, type=Path)
    parser.add_argument("--tokens", required=True, type=Path, help="pretokenize stage output folder")
    parser.add_argument("--tokenizer", required=True, type=Path)
    parser.add_argument("--eval-data", required=True, type=Path, help="eval_data stage output folder")
    parser.add_argument("--out", required=True, type=Path, help="output folder, e.g. results/<run>/eval")
    args = parser.parse_args()
    run = stage_config(args, "eval")
    train = run.train
    device = select_device(train.device)
    configure(device)  # TF32 for fp32 matmuls on a GPU; on the CPU, the allocator that keeps freed memory
    logging.getLogger("kiln.eval").info(
        "eval on %s (train.device %s, train.precision %s)", device, train.device, train.precision
    )
    paths = RunPaths(args.model, args.shards, args.tokens, args.tokenizer, args.eval_data)
    sampler = train_sampler(args.tokenizer, train)
    out = evaluate(paths, run.eval, train.seed, args.out, device, train.precision, sampler)
    out.write(args.out)
    metrics = out.metrics
    infill = metrics["infill"]
    infill = (
        f"infill not run ({infill['not_run']})"
        if "not_run" in infill
        else f"infill exact match {infill['all']['exact_match']}"
    )
    print(
        f"eval: val loss {metrics['val_loss']:.4f} (unigram {metrics['unigram_val_loss']:.4f}), "
        f"{metrics['val_bits_per_byte']:.3f} bits/byte (unigram {metrics['unigram_bits_per_byte']:.3f}), {infill} "
        f"-> {args.out}"
    )


if __name__ == "__main__":
    run_main(main)
