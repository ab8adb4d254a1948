"""shard stage: pack each split's tokens into rows of seq_len + 1 and write checked binary shards.

Writes <out>/{train,val}-NNNNN.bin and <out>/manifest.json (sha256 per shard). With --verify, checks
an existing shard folder against its manifest instead.
"""

from pathlib import Path

import numpy as np

from kiln.cli import run_main, stage_config, stage_parser
from kiln.data.pretokenize import SPLITS
from kiln.data.shards import shard_split, verify_shards
from kiln.io import atomic_dir, read_json, write_json


def main() -> None:
    parser = stage_parser("shard", __doc__)
    parser.add_argument("--tokens", required=True, type=Path, help="pretokenize stage output folder")
    parser.add_argument("--out", required=True, type=Path, help="output folder, e.g. results/<run>/shards")
    parser.add_argument("--verify", action="store_true", help="verify --out against its manifest and exit")
    args = parser.parse_args()
    if args.verify:
        verify_shards(args.out, read_json(args.out / "manifest.json"))
        print(f"shard: {args.out} verified")
        return
    cfg = stage_config(args, "shard")["shard"]
    meta = read_json(args.tokens / "meta.json")
    row_len = cfg["seq_len"] + 1
    with atomic_dir(args.out) as tmp:
        splits = {
            split: shard_split(np.memmap(args.tokens / f"{split}.bin", dtype=meta["dtype"], mode="r"), tmp, split,
                               row_len, cfg["rows_per_shard"], meta["padded_vocab_size"])
            for split in SPLITS
        }
        write_json(tmp / "manifest.json", {
            "seq_len": cfg["seq_len"], "row_len": row_len, "dtype": meta["dtype"],
            "vocab_size": meta["vocab_size"], "padded_vocab_size": meta["padded_vocab_size"],
            "splits": splits,
        })
    print(f"shard: train {splits['train']['rows']} rows, val {splits['val']['rows']} rows of {row_len} -> {args.out}")


if __name__ == "__main__":
    run_main(main)
