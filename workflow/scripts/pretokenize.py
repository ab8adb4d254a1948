"""pretokenize stage: encode every document (FIM on the train side, EOS after each), split train/val.

Writes <out>/train.bin, <out>/val.bin (raw token ids), <out>/val_ids.txt and <out>/meta.json.
"""

from pathlib import Path

from kiln.cli import run_main, stage_config, stage_parser
from kiln.data.pretokenize import pretokenize
from kiln.io import atomic_dir, write_json


def main() -> None:
    parser = stage_parser("pretokenize", __doc__)
    parser.add_argument("--raw", required=True, type=Path, help="download stage output folder")
    parser.add_argument("--tokenizer", required=True, type=Path, help="tokenizer.json")
    parser.add_argument("--out", required=True, type=Path, help="output folder, e.g. results/<run>/tokens")
    args = parser.parse_args()
    cfg = stage_config(args, "pretokenize")
    with atomic_dir(args.out) as tmp:
        meta = pretokenize(args.raw, args.tokenizer, tmp, cfg["seed"], cfg["pretokenize"])
        write_json(tmp / "meta.json", meta)
    s = meta["splits"]
    print(f"pretokenize: train {s['train']['docs']} docs / {s['train']['tokens']} tokens, "
          f"val {s['val']['docs']} docs / {s['val']['tokens']} tokens -> {args.out}")


if __name__ == "__main__":
    run_main(main)
