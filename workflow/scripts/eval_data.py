"""eval_data stage: what the eval stage measures a model against, made from the data alone, on a CPU
beside training (kiln.eval.prepared): the unigram baseline, the infilling problems, the local lm-eval
tasks' data and the 13-gram contamination of each eval set against the training tokens.

Writes <out>/eval_data.json and <out>/lm_eval_tasks/ (kiln.layout).
"""

from pathlib import Path

from kiln.eval.prepared import DataPaths, prepare
from kiln.stage import run_main, stage_config, stage_parser


def main() -> None:
    parser = stage_parser("eval_data", __doc__)
    parser.add_argument("--shards", required=True, type=Path, help="shard stage output folder")
    parser.add_argument("--tokens", required=True, type=Path, help="pretokenize stage output folder")
    parser.add_argument("--raw", required=True, type=Path, help="download stage output folder")
    parser.add_argument("--tokenizer", required=True, type=Path, help="the tokenizer stage's tokenizer.json")
    parser.add_argument("--out", required=True, type=Path, help="output folder, e.g. results/<run>/eval_data")
    args = parser.parse_args()
    run = stage_config(args, "eval_data")
    paths = DataPaths(args.shards, args.tokens, args.raw, args.tokenizer)
    data = prepare(paths, run.eval, run.seed, run.train.init_from, args.out)
    hits = ", ".join(f"{name} {c['contaminated_items']}/{c['items']}" for name, c in data.contamination.items())
    infill = data.infill_not_run or f"{len(data.infill_problems)} infilling problems"
    print(
        f"eval_data: unigram val loss {data.unigram_val_loss:.4f}; {infill}; "
        f"contaminated items: {hits or 'no eval sets'} -> {args.out}"
    )


if __name__ == "__main__":
    run_main(main)
