"""`kiln rehearse`'s count of a train step's peak against the same step measured with real tensors on
this CPU (issue 59, item 2: within 10%; kiln.rehearse.calibration says how each side is taken).

    python bench/rehearse_calibration.py          # the default and the tiny config, three micro-batches each, and FSDP2 rows
    python bench/rehearse_calibration.py --quick  # one small row of each config: tests/bench/test_bench.py

Each row is one config (config/config.yaml's, tests/configs/tiny.yaml) at a micro-batch, precision and
number of ranks (rank 0 of them measured; FSDP2 and AdamW above one), train.device cpu, compile off.
"""

from __future__ import annotations

from pathlib import Path

import common  # bench/ is sys.path[0]

from kiln.rehearse.calibration import cpu_run, rehearsed_and_measured

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {"default": [], "tiny": [str(REPO / "tests" / "configs" / "tiny.yaml")]}
# (config, micro-batch, precision, ranks)
ROWS = [(name, micro, precision, 1) for name in CONFIGS for micro in (4, 16, 32) for precision in ("fp32", "bf16")]
ROWS += [(name, 4, "fp32", ranks) for name in CONFIGS for ranks in (2, 4)]
QUICK_ROWS = [("default", 1, "fp32", 1), ("tiny", 2, "bf16", 2)]


def main() -> None:
    args = common.parser(__doc__).parse_args()
    print("| config | ranks | micro-batch x seq | precision | rehearsed MiB | measured MiB | rehearsed / measured |")
    print("|---|---:|---|---|---:|---:|---:|")
    for name, micro, precision, ranks in QUICK_ROWS if args.quick else ROWS:
        run, vocab = cpu_run(CONFIGS[name], micro, precision, ranks)
        rehearsed, measured = rehearsed_and_measured(run, vocab)
        print(
            f"| {name} | {ranks} | {micro} x {run.shard.seq_len} | {precision} | {rehearsed / 2**20:,.2f} | "
            f"{measured / 2**20:,.2f} | {rehearsed / measured:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
