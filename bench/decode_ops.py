"""What a decode step of Kiln's decoding (kiln.generate.decode) asks of the device, counted by
kiln.generate.ops' dispatch mode: the kernels an eager step launches, in each layer and outside them,
beside what kiln.plan.decode prices a step at; and the host syncs of a decode of 32 and of 64 tokens.
Counts, not timings: the same on any machine with the same torch.

    python bench/decode_ops.py           # every family, fp32 (a CPU eval) and bf16 autocast (a GPU eval's)
    python bench/decode_ops.py --quick   # llama only

The models are kiln.generate.ops.COUNTED_MODELS (tiny: the sizes do not change the count); the batch is
two prompts of different lengths (padded, as the eval's are) with a stop id that never comes, so every
step is decoded. Sampled: temperature 0.8,
top-p 0.95 (the Codex protocol's pass@10 setting, kiln.eval.code).
"""

from __future__ import annotations

import common  # bench/ is sys.path[0]
import torch

from kiln.generate.ops import COUNTED_MODELS, PADDED_PROMPTS, count_generate, count_step_kernels
from kiln.model.build import build_model
from kiln.plan.decode import KERNELS_OUTSIDE_LAYERS, KERNELS_PER_LAYER


def sampled() -> dict:
    return {"temperature": 0.8, "top_p": 0.95, "generator": torch.Generator().manual_seed(0)}


def main() -> None:
    args = common.parser(__doc__, quick="llama only").parse_args()
    torch.set_num_threads(1)
    families = ["llama"] if args.quick else sorted(COUNTED_MODELS)
    print("| family | precision | kernels a layer | outside the layers, greedy | sampled | priced (a layer, outside) |")
    print("|---|---|---:|---:|---:|---:|")
    for family in families:
        cfg = COUNTED_MODELS[family]
        for precision, bf16 in (("fp32", False), ("bf16 autocast", True)):
            greedy = count_step_kernels(cfg, autocast_bf16=bf16)
            sampling = count_step_kernels(cfg, autocast_bf16=bf16, **sampled())
            priced = f"{KERNELS_PER_LAYER[family]}, {KERNELS_OUTSIDE_LAYERS[family]}"
            print(
                f"| {family} | {precision} | {greedy.per_layer:g} | {greedy.outside_layers:g} | "
                f"{sampling.outside_layers:g} | {priced} |"
            )
    torch.manual_seed(0)
    model = build_model(COUNTED_MODELS["llama"]).eval()
    never = {"stop_ids": frozenset({127}), "vocab_size": 127}  # a stop id outside the vocabulary
    print("\n| llama decode | host syncs, 32 tokens | 64 tokens |\n|---|---:|---:|")
    for name, kwargs in (("greedy", {}), ("sampled", sampled())):
        syncs = [count_generate(model, PADDED_PROMPTS, n, **never, **kwargs).syncs for n in (32, 64)]
        print(f"| {name} | {syncs[0]} | {syncs[1]} |")


if __name__ == "__main__":
    main()
