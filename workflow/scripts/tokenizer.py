"""tokenizer stage: train a byte-level BPE on the downloaded documents, or adopt a pretrained
tokenizer.json or a local tiktoken encoding (tokenizer.kind).

Writes tokenizer.json (Hugging Face tokenizers format) and stats.json (vocab size and its padded
size, special token ids, bytes per token on held-out documents).
"""

import resource
from pathlib import Path

from kiln.config.special_tokens import SPECIAL_TOKENS
from kiln.data.tokenizer_build import build_tokenizer, training_memory_mb, write_tokenizer
from kiln.io import atomic_file, write_json
from kiln.stage import run_main, stage_config, stage_derived, stage_parser


def main() -> None:
    parser = stage_parser("tokenizer", __doc__)
    parser.add_argument("--raw", required=True, type=Path, help="download stage output folder")
    parser.add_argument("--tokenizer", required=True, type=Path, help="output tokenizer.json")
    parser.add_argument("--stats", required=True, type=Path, help="output stats.json")
    args = parser.parse_args()
    run = stage_config(args, "tokenizer")
    uses = stage_derived(args, "tokenizer").get("roles", SPECIAL_TOKENS)  # kind hf: what the run's samples use
    tokenizer, stats = build_tokenizer(args.raw, run.tokenizer, run.seed, uses)
    with atomic_file(args.tokenizer) as tmp:
        write_tokenizer(tokenizer, run.tokenizer, stats, tmp)
    write_json(args.stats, stats)
    print(f"tokenizer: {stats['vocab_size']} tokens, {stats['heldout_bytes_per_token']:.2f} bytes/token held out")
    # the measured peak beside what the job asked for (mem_mb on a cluster), for a corpus unlike the fit's
    print(
        f"tokenizer: peak host memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024:,} MiB; planned {training_memory_mb(run.tokenizer):,} MiB"
    )


if __name__ == "__main__":
    run_main(main)
