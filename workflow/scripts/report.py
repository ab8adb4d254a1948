"""report stage: results/<run>/report.md with the loss curve (PNG), data and eval tables, samples."""

from pathlib import Path

from kiln.eval.metrics.output import EvalOutput
from kiln.io import atomic_file, read_json
from kiln.layout import METRICS, SAMPLES
from kiln.plan.verdict import SmokeReport
from kiln.report.run import plot_loss, read_metrics, render
from kiln.stage import run_main, stage_config, stage_parser


def main() -> None:
    parser = stage_parser("report", __doc__)
    inputs = {
        "raw": "download stage's folder (its manifest.json)",
        "tokenizer-stats": "tokenizer stage's stats.json",
        "tokens": "pretokenize stage's folder (its meta.json)",
        "shards": "shard stage's folder (its manifest.json)",
        "smoke": "smoke stage's report.json",
        "plan": "plan stage's plan.json",
        "train": "train stage's summary.json (metrics.jsonl and samples.jsonl beside it)",
    }
    for name, what in inputs.items():
        parser.add_argument(f"--{name}", required=True, type=Path, help=what)
    parser.add_argument(
        "--eval",
        required=True,
        type=Path,
        help="eval stage's folder (metrics.json, samples.json: kiln.eval.metrics.output)",
    )
    parser.add_argument("--report", required=True, type=Path, help="output report.md")
    parser.add_argument("--plot", required=True, type=Path, help="output loss-curve PNG")
    args = parser.parse_args()
    run = stage_config(args, "report")
    train = args.train.parent
    data = {
        "config": run,
        "raw": read_json(args.raw / "manifest.json"),
        "tokenizer": read_json(args.tokenizer_stats),
        "tokens": read_json(args.tokens / "meta.json"),
        "shards": read_json(args.shards / "manifest.json"),
        "smoke": SmokeReport.load(args.smoke),
        "plan": read_json(args.plan),
        "train": read_json(args.train),
        "train_samples": read_metrics(train / SAMPLES),
        "eval": EvalOutput.read(args.eval),
        "metrics": read_metrics(train / METRICS),  # the loss curve; a continued run's step-0 validation
    }
    with atomic_file(args.plot) as tmp:
        ev = data["eval"].metrics
        plot_loss(
            data["metrics"],
            tmp,
            ev["unigram_val_loss"],
            bits_per_nat=ev["val_bits_per_byte"] / ev["val_loss"],
            cooldown_from=data["train"].get("cooldown_from"),
        )
    with atomic_file(args.report) as tmp:
        tmp.write_text(render(run.run_name, data, args.plot.name), encoding="utf-8")
    print(f"report: {args.report.resolve()}")


if __name__ == "__main__":
    run_main(main)
