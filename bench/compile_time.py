"""torch.compile of a llama whole against block by block (kiln.train.parallel.compile_blocks, what
train does at every world size): the graphs dynamo hands the backend, and the first forward and
backward's time (the compile). docs/benchmarks.md, section "GPU check".

    # inductor, its caches off, so each run compiles cold:
    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_AUTOGRAD_CACHE=0 \\
        python bench/compile_time.py --mode whole --layers 16
    python bench/compile_time.py --mode block --backend count --layers 8   # graphs only: 1 for all blocks
    python bench/compile_time.py --quick       # block, count, 2 layers: what tests/test_bench.py runs
"""

from __future__ import annotations

import argparse
import time

import torch

from kiln.config.models import model_config
from kiln.model.build import build_model
from kiln.train.parallel import compile_blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["whole", "block"], help="required unless --quick")
    parser.add_argument("--backend", default="inductor", help="a torch.compile backend, or count (graphs only)")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny input through every part that prints the table (tests/test_bench.py); figures meaningless",
    )
    args = parser.parse_args()
    if args.quick:
        vars(args).update(mode="block", backend="count", layers=2)
    if args.mode is None:
        parser.error("--mode is required")
    torch.manual_seed(0)
    model = build_model(
        model_config({"family": "llama", "n_layer": args.layers, "n_head": 4, "n_kv_head": 2, "d_model": 128}, 512, 128)
    )
    graphs: list[int] = []

    def count(gm, example_inputs):  # the nodes of each graph dynamo traced; runs it as traced
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    backend = count if args.backend == "count" else args.backend
    if args.mode == "whole":
        model.compile(backend=backend)
    else:
        compile_blocks(model, backend=backend)
    idx = torch.randint(0, 512, (2, 128))
    start = time.perf_counter()
    _, loss = model(idx, idx)
    loss.backward()
    print(
        f"{args.mode}, {args.backend}, {args.layers} layers: first forward and backward "
        f"{time.perf_counter() - start:.1f} s" + (f"; graphs (nodes): {graphs}" if graphs else "")
    )


if __name__ == "__main__":
    main()
