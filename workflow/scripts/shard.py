"""shard stage: pack each split's tokens into rows of seq_len + 1 and write checked binary shards.

Writes <out>/{train,val}-NNNNN.bin and <out>/manifest.json (sha256 per shard). With --verify, checks
an existing shard folder (--out) against its manifest instead: headers, sizes, every id below the
vocabulary size, checksums; --report then records the result.
"""

from pathlib import Path

from kiln.data.shards import verify_shards, write_shards
from kiln.io import atomic_dir, read_json, write_json
from kiln.stage import run_main, stage_config, stage_parser


def main() -> None:
    parser = stage_parser("shard", __doc__)
    parser.add_argument("--tokens", type=Path, help="pretokenize stage output folder (not with --verify)")
    parser.add_argument(
        "--out", required=True, type=Path, help="output folder, e.g. results/data/shards-<key> (kiln.layout)"
    )
    parser.add_argument("--verify", action="store_true", help="verify --out against its manifest and exit")
    parser.add_argument("--report", type=Path, help="with --verify: write the result here as JSON")
    args = parser.parse_args()
    if args.verify:
        checked = verify_shards(args.out, read_json(args.out / "manifest.json"))
        if args.report:
            write_json(args.report, {"verified": str(args.out), "splits": checked})
        summary = ", ".join(f"{split}: {c['shards']} shards" for split, c in checked.items())
        print(f"shard: {args.out} verified ({summary})")
        return
    if args.tokens is None:
        parser.error("--tokens is required unless --verify")
    shard = stage_config(args, "shard").shard
    with atomic_dir(args.out) as tmp:
        manifest = write_shards(args.tokens, tmp, shard.seq_len, shard.rows_per_shard)
    splits, row_len = manifest["splits"], manifest["row_len"]
    print(f"shard: train {splits['train']['rows']} rows, val {splits['val']['rows']} rows of {row_len} -> {args.out}")


if __name__ == "__main__":
    run_main(main)
