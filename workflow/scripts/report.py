"""report stage: results/<run>/report.md with the loss curve (PNG), data and eval tables, samples."""

from pathlib import Path

from kiln.cli import run_main, stage_config, stage_parser
from kiln.eval.report import plot_loss, read_metrics, render
from kiln.io import atomic_file, read_json
from kiln.train.verdict import SmokeReport


def main() -> None:
    parser = stage_parser("report", __doc__)
    parser.add_argument("--results", required=True, type=Path, help="results/<run> folder")
    parser.add_argument("--report", required=True, type=Path, help="output report.md")
    parser.add_argument("--plot", required=True, type=Path, help="output loss-curve PNG")
    args = parser.parse_args()
    cfg = stage_config(args, "report")
    r = args.results
    data = {
        "config": cfg,
        "tokenizer": read_json(r / "tokenizer" / "stats.json"),
        "tokens": read_json(r / "tokens" / "meta.json"),
        "shards": read_json(r / "shards" / "manifest.json"),
        "smoke": SmokeReport.load(r / "smoke" / "report.json"),
        "plan": read_json(r / "smoke" / "plan.json"),
        "train": read_json(r / "train" / "summary.json"),
        "train_samples": read_metrics(r / "train" / "samples.jsonl"),
        "eval": read_json(r / "eval" / "metrics.json"),
        "samples": read_json(r / "eval" / "samples.json"),
    }
    with atomic_file(args.plot) as tmp:
        ev = data["eval"]
        plot_loss(read_metrics(r / "train" / "metrics.jsonl"), tmp, ev["unigram_val_loss"], cfg["eval"]["reference"],
                  bits_per_nat=ev["val_bits_per_byte"] / ev["val_loss"])
    with atomic_file(args.report) as tmp:
        tmp.write_text(render(cfg["run_name"], data, args.plot.name), encoding="utf-8")
    print(f"report: {args.report.resolve()}")


if __name__ == "__main__":
    run_main(main)
