"""rehearse stage: the run's GPU-side work at its real shapes and world size on fake tensors
(kiln.rehearse.run), from its config alone. Prints each phase's per-rank peak against plan.gpu's
usable memory and writes rehearsal.json (kiln.plan.rehearsal) when every phase fits and the run will
start; otherwise exits 1 naming the first that does not, with the fix, and writes nothing.

    python workflow/scripts/rehearse.py --config config/config.yaml --run stdlib-code --out /tmp/rehearsal.json
"""

import time
from pathlib import Path

from kiln.config.special_tokens import SPECIAL_TOKENS
from kiln.forecast import model_vocab
from kiln.plan.peaks import planned_gpu
from kiln.plan.rehearsal import check, render
from kiln.rehearse.run import rehearse
from kiln.stage import run_main, stage_config, stage_derived, stage_parser, stage_tracked


def main() -> None:
    parser = stage_parser("rehearse", __doc__)
    parser.add_argument("--run", required=True, help="the run's name (results/<run>/)")
    parser.add_argument("--out", required=True, type=Path, help="output rehearsal.json")
    args = parser.parse_args()
    run = stage_config(args, "rehearse").replace(run_name=args.run)
    # what the whole config implies (kiln.config.settings.derived): an hf tokenizer's vocabulary holds the
    # roles the run appends; the eval batches on (this stage does not read pretokenize, which decides infilling)
    implied = stage_derived(args, "rehearse")
    vocab = model_vocab(run.tokenizer, implied.get("roles", SPECIAL_TOKENS))
    started = time.perf_counter()
    rehearsal = rehearse(run, vocab, planned_gpu(run.plan.gpu), implied["eval_batches_on"])
    print(render(rehearsal) + f"\n\n({time.perf_counter() - started:.0f} s)", flush=True)
    check(rehearsal)
    rehearsal.settings = stage_tracked(args, "rehearse")  # what `kiln plan` shows it beside
    rehearsal.save(args.out)


if __name__ == "__main__":
    run_main(main)
