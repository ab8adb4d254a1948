"""report stage: results/<run>/report.md with the loss curve (PNG), data and eval tables, samples."""

from pathlib import Path

from kiln.io import atomic_file, read_json
from kiln.layout import METRICS, SAMPLES, Layout
from kiln.plan.verdict import SmokeReport
from kiln.report.run import plot_loss, read_metrics, render
from kiln.stage import run_main, stage_config, stage_parser


def main() -> None:
    parser = stage_parser("report", __doc__)
    parser.add_argument(
        "--results",
        required=True,
        type=Path,
        help="the results folder (results/): the run's stages and the data stages it used are "
        "found there by kiln.layout from the config",
    )
    parser.add_argument("--report", required=True, type=Path, help="output report.md")
    parser.add_argument("--plot", required=True, type=Path, help="output loss-curve PNG")
    args = parser.parse_args()
    cfg = stage_config(args, "report")
    paths = Layout(cfg, root=args.results)
    train = paths.folder("train")
    data = {
        "config": cfg,
        "tokenizer": read_json(paths.output("tokenizer", "stats.json")),
        "tokens": read_json(paths.folder("pretokenize") / "meta.json"),
        "shards": read_json(paths.folder("shard") / "manifest.json"),
        "smoke": SmokeReport.load(paths.output("smoke", "report.json")),
        "plan": read_json(paths.output("smoke", "plan.json")),
        "train": read_json(paths.output("train", "summary.json")),
        "train_samples": read_metrics(train / SAMPLES),
        "eval": read_json(paths.output("eval", "metrics.json")),
        "samples": read_json(paths.output("eval", "samples.json")),
    }
    with atomic_file(args.plot) as tmp:
        ev = data["eval"]
        plot_loss(
            read_metrics(train / METRICS),
            tmp,
            ev["unigram_val_loss"],
            cfg["eval"]["reference"],
            bits_per_nat=ev["val_bits_per_byte"] / ev["val_loss"],
        )
    with atomic_file(args.report) as tmp:
        tmp.write_text(render(cfg["run_name"], data, args.plot.name), encoding="utf-8")
    print(f"report: {args.report.resolve()}")


if __name__ == "__main__":
    run_main(main)
