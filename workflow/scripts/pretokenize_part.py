"""pretokenize_part stage job: encode one raw part whole (every sample laid out for training, and its
candidates for the first validation round) for the pretokenize job to gather. One such job per raw
part is the pretokenize stage's scatter; the gathered output is the bytes one job would write.

Writes <out>/train.bin, samples.npy, val.bin and part.json (kiln.data.token_parts).
"""

from pathlib import Path

from kiln.data.pretokenize import pretokenize_part
from kiln.io import atomic_dir
from kiln.stage import run_main, stage_config, stage_parser


def main() -> None:
    parser = stage_parser("pretokenize", __doc__)
    parser.add_argument("--raw", required=True, type=Path, help="download stage output folder")
    parser.add_argument("--tokenizer", required=True, type=Path, help="tokenizer.json")
    parser.add_argument("--part", required=True, type=int, help="the raw part's index, in manifest order")
    parser.add_argument(
        "--out", required=True, type=Path, help="output folder, e.g. results/data/tokens-<key>.parts/part-00000"
    )
    args = parser.parse_args()
    run = stage_config(args, "pretokenize")
    with atomic_dir(args.out) as tmp:
        part = pretokenize_part(args.raw, args.tokenizer, args.part, tmp, run.seed, run.pretokenize)
    print(
        f"pretokenize_part {args.part}: {len(part.rows)} samples, {int(part.counts[:, 0].sum())} train-side tokens, "
        f"{len(part.candidates)} validation candidates -> {args.out}"
    )


if __name__ == "__main__":
    run_main(main)
