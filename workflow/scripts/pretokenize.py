"""pretokenize stage: encode every document (FIM on the train side, EOS after each), hold out a fixed
number of validation tokens by document, share the train tokens among sources by mixture weight.

Writes <out>/train.bin, <out>/val.bin (raw token ids), <out>/val_ids.txt and <out>/meta.json. With
--parts (the workflow's way), it gathers the pretokenize_part jobs' encodings, one per raw part;
without, it encodes every part itself in --workers processes. The bytes are the same.
"""

from pathlib import Path

from kiln.data.pretokenize import pretokenize
from kiln.io import atomic_dir
from kiln.stage import run_main, stage_config, stage_parser


def main() -> None:
    parser = stage_parser("pretokenize", __doc__)
    parser.add_argument("--raw", required=True, type=Path, help="download stage output folder")
    parser.add_argument("--tokenizer", required=True, type=Path, help="tokenizer.json")
    parser.add_argument(
        "--out", required=True, type=Path, help="output folder, e.g. results/data/tokens-<key> (kiln.layout)"
    )
    parser.add_argument("--workers", type=int, default=1, help="worker processes (the output does not depend on it)")
    parser.add_argument(
        "--parts", nargs="+", type=Path, help="pretokenize_part outputs, one per raw part in manifest order, to gather"
    )
    args = parser.parse_args()
    run = stage_config(args, "pretokenize")
    with atomic_dir(args.out) as tmp:
        meta = pretokenize(args.raw, args.tokenizer, tmp, run.seed, run.pretokenize, args.workers, part_dirs=args.parts)
    s = meta["splits"]
    print(
        f"pretokenize: train {s['train']['docs']} docs / {s['train']['tokens']} tokens, "
        f"val {s['val']['docs']} docs / {s['val']['tokens']} tokens ({meta['encoder']['name']}) -> {args.out}"
    )


if __name__ == "__main__":
    run_main(main)
