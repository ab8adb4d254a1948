"""`kiln export results/<run>`: a finished run's Hugging Face folder made again from its final weights and
tokenizer, without training (the train job writes train/hf at its end; kiln.hf does the export).
torch is imported when the command runs, not when `kiln` starts: `kiln status` runs without it."""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.layout import Layout


def run(args: argparse.Namespace) -> None:
    from kiln import hf
    from kiln.model.build import load_model

    paths = Layout.read(args.directory / args.run_dir)
    train = paths.folder("train")
    out = args.out or train / "hf"
    hf.export(load_model(train), out, paths.output("tokenizer", "tokenizer.json"))
    print(f"kiln: exported {train} to {out}")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export a finished run's final model to a Hugging Face folder again, without training",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("run_dir", type=Path, metavar="run", help="the run's folder, results/<run_name>")
    parser.add_argument("--directory", type=Path, default=Path("."), help="where snakemake ran (default: here)")
    parser.add_argument("--out", type=Path, help="the folder to write (default: results/<run>/train/hf)")
    parser.set_defaults(run=run)
