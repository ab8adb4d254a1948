"""What autograd keeps for backward, per layer: Kiln's Llama block beside transformers' own
LlamaDecoderLayer (what seed 000 trained, through torchtitan's transformers backend) at the same
shape, eager and compiled, against kiln.plan.memory's count; then seed 000's measured 70.2 GiB
rebuilt from these figures, and the seed's setting as Kiln would run it.

    python bench/saved_tensors.py                                   # seed 000's widths, 2 x 512 tokens
    python bench/saved_tensors.py --d-model 512 --n-head 8 --n-kv-head 2 --d-ff 2048 --seq 1024 --batch 3
    python bench/saved_tensors.py --quick   # eager at d_model 64 (the loss too), seed 000 from the
                                            # eager bf16 row: what tests/test_bench.py runs

Each row runs one block under bf16 autocast on this CPU (a warm-up forward and backward first, which
compiles), then one forward with autograd's saved-tensor hooks on (kiln.train.cpu_memory.
saved_for_backward: distinct storages, parameters left out), split into activations (per token),
bf16 copies of fp32 weights (autocast's casts, kept by the matmuls), and RoPE tables (per block,
not per token). "fp32 weights" is Kiln's setting and torchtitan's DDP default (fp32 parameters,
autocast); "bf16 weights" is seed 000's (training.dtype = "bfloat16": parameters, gradients and
AdamW state all bf16, so the residual stream is bf16 too and autocast casts nothing). The profiler
column cross-checks the hooks: bytes the forward allocated and left alive, less its output, plus the
block's input. "compiled" is inductor (C++ on the CPU) and aot_eager_decomp_partition (inductor's
decompositions and min-cut partitioner without code generation, what tests/test_memory.py uses).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from kiln.config.models import ModelConfig, model_config
from kiln.model.llama import Block, rope_tables
from kiln.plan.memory import GIB, Setting, estimate, layer_activation_bytes, layer_params
from kiln.train.cpu_memory import allocated_during, saved_for_backward

MODES = ("eager", "aot_eager_decomp_partition", "inductor")
# Seed 000 (shared/seeds/000_*.txt): llama3.2-1b shapes, V 32,768, micro-batch 6 x 8192 on each of 4
# H100s under DDP (torch's composable replicate), compiled per block, no activation checkpointing,
# training.dtype bfloat16; logged 70.2 GiB active (torch.cuda.memory_stats active_bytes peak).
SEED = {"tokens": 6 * 8192, "vocab": 32768, "measured_gib": 70.2, "world": 4}


def kiln_block(cfg: ModelConfig):
    block = Block(cfg)
    cos, sin = rope_tables(cfg.head_dim, cfg.seq_len, cfg.rope_theta)
    return block, (lambda m, x: m(x, cos, sin)), [cos, sin]


def hf_block(cfg: ModelConfig, dtype: torch.dtype):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    hf = LlamaConfig(
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_attention_heads=cfg.n_head,
        num_key_value_heads=cfg.n_kv_head,
        max_position_embeddings=cfg.seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta,
        vocab_size=cfg.vocab_size,
        num_hidden_layers=1,
    )
    hf._attn_implementation = "sdpa"  # torchtitan's "sdpa_torchtitan" is transformers' sdpa_attention_forward
    block = LlamaDecoderLayer(hf, 0)
    pos = torch.arange(cfg.seq_len)[None]
    # LlamaModel makes the tables in the hidden states' dtype: fp32 beside fp32 weights, bf16 beside bf16
    cos, sin = LlamaRotaryEmbedding(hf)(torch.zeros(1, dtype=dtype), pos)
    return block, (lambda m, x: m(x, position_embeddings=(cos, sin), position_ids=pos)), [cos, sin]


def measure(block, call, tables, cfg: ModelConfig, batch: int, mode: str, dtype: torch.dtype) -> dict:
    """Bytes one block keeps for backward, by kind; per token except the tables."""
    block = block.to(dtype)
    fn = block if mode == "eager" else torch.compile(block, backend=mode)
    tokens = batch * cfg.seq_len
    x = torch.randn(batch, cfg.seq_len, cfg.d_model, dtype=dtype, requires_grad=True)

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return call(fn, x)

    forward().float().sum().backward()  # warm-up; compiles
    params = list(block.parameters())
    _, saved = saved_for_backward(forward, exclude=[*params, *tables])
    y, alloc = allocated_during(forward)
    weight_shapes = {tuple(p.shape) for p in params if p.dim() == 2} | {
        tuple(p.shape)[::-1] for p in params if p.dim() == 2
    }
    table_shapes = {(cfg.seq_len, cfg.head_dim), (1, cfg.seq_len, cfg.head_dim)}  # q, k are (B, H, T, D)
    out = {"activations": 0, "weight copies": 0, "tables": 0}
    for s in saved:
        kind = "weight copies" if s.shape in weight_shapes else "tables" if s.shape in table_shapes else "activations"
        out[kind] += s.nbytes
    out["profiler"] = alloc.end - y.untyped_storage().nbytes() + x.untyped_storage().nbytes()
    out["hooks"] = sum(s.nbytes for s in saved)
    out["per token"] = out["activations"] / tokens
    return out


def table(cfg: ModelConfig, batch: int, modes: tuple[str, ...]) -> dict:
    tokens = batch * cfg.seq_len
    mat, _ = layer_params(cfg)
    print(
        f"Per layer, {batch} x {cfg.seq_len} tokens, d_model {cfg.d_model}, {cfg.n_head} heads ({cfg.n_kv_head} kv), "
        f"d_ff {cfg.d_ff}; bf16 autocast; bytes per token unless said\n"
    )
    print(
        "| block | weights | mode | activations / token | estimate / token | weight copies (MiB) | estimate (MiB) "
        "| RoPE tables (KiB) | hooks = profiler? | s |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---|---:|")
    results = {}
    rows = [("Kiln Block", "fp32", m) for m in modes] + [("transformers LlamaDecoderLayer", "fp32", m) for m in modes]
    rows += [("transformers LlamaDecoderLayer", "bf16", m) for m in modes if m != "aot_eager_decomp_partition"]
    rows += [("Kiln Block", "bf16", "inductor")] if "inductor" in modes else []
    for name, weights, mode in rows:
        torch._dynamo.reset()
        torch.manual_seed(0)
        dtype = torch.float32 if weights == "fp32" else torch.bfloat16
        block, call, tables = kiln_block(cfg) if name.startswith("Kiln") else hf_block(cfg, dtype)
        start = time.perf_counter()
        r = measure(block, call, tables, cfg, batch, mode, dtype)
        compiled = mode != "eager"
        est = layer_activation_bytes(cfg, tokens, bf16=True, compiled=compiled) / tokens if weights == "fp32" else None
        est_copies = 2 * mat / 2**20 if weights == "fp32" else 0.0
        same = "yes" if r["hooks"] == r["profiler"] else f"{r['profiler'] / r['hooks']:.3f}"
        print(
            f"| {name} | {weights} | {mode} | {r['per token']:,.0f} | {'-' if est is None else f'{est:,.0f}'} | "
            f"{r['weight copies'] / 2**20:,.2f} | {est_copies:,.2f} | {r['tables'] / 1024:,.0f} | {same} | "
            f"{time.perf_counter() - start:.0f} |",
            flush=True,
        )
        results[(name, weights, mode)] = r
    return results


def loss_bytes_per_logit(n: int = 2048, vocab: int = 8192, backend: str = "inductor") -> tuple[float, float]:
    """torchtitan's loss (components/loss.py cross_entropy_loss, compiled as seed 000 ran it) on bf16
    logits: bytes per logit it keeps for backward, and the most its backward allocates above that."""

    def cross_entropy_loss(pred, labels):
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    torch._dynamo.reset()
    fn = torch.compile(cross_entropy_loss, backend=backend)
    labels = torch.randint(0, vocab, (1, n))
    for _ in range(2):
        logits = torch.randn(1, n, vocab, dtype=torch.bfloat16, requires_grad=True)
        loss, saved = saved_for_backward(lambda: fn(logits, labels))
        _, alloc = allocated_during(lambda: torch.autograd.grad(loss, logits))
    return sum(s.nbytes for s in saved) / (n * vocab), alloc.peak / (n * vocab)


def hf_outside_per_token(cfg: ModelConfig) -> float:
    """What the final RMSNorm (transformers', eager: outside the compiled blocks) and the head's
    matmul keep, per token, in seed 000's bf16 setting."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(cfg.d_model, eps=cfg.norm_eps).to(torch.bfloat16)
    head = torch.randn(cfg.vocab_size, cfg.d_model, dtype=torch.bfloat16, requires_grad=True)
    x = torch.randn(2, cfg.seq_len, cfg.d_model, dtype=torch.bfloat16, requires_grad=True)

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return F.linear(norm(x), head)

    _, saved = saved_for_backward(run, exclude=[head, *norm.parameters()])
    return sum(s.nbytes for s in saved) / x.shape[0] / cfg.seq_len


def seed_000(per_token_bf16: float, logit_bytes: float, outside: float) -> None:
    """Seed 000's 70.2 GiB rebuilt, and Kiln's estimate of the same setting beside it."""
    cfg = model_config({"flavour": "llama3.2-1b"}, vocab_size=SEED["vocab"], seq_len=8192)
    n, tokens, L = cfg.num_params(non_embedding=False), SEED["tokens"], cfg.n_layer
    logits = logit_bytes * tokens * SEED["vocab"]
    parts = {
        "weights (bf16)": 2 * n,
        "AdamW moments (bf16)": 4 * n,
        "DDP buckets (bf16; replicate() keeps gradients apart from them)": 2 * n,
        f"activations ({L} x {per_token_bf16:,.0f} B x {tokens:,} tokens)": L * per_token_bf16 * tokens,
        f"final norm and head input ({outside:,.0f} B a token)": outside * tokens,
        f"logits ({logit_bytes:.2f} B x {tokens:,} x {SEED['vocab']:,}: kept bf16 + their bf16 gradient)": logits,
    }
    total = sum(parts.values())
    print(
        "\nSeed 000 rebuilt (torchtitan, transformers backend, all-bf16 training), at the peak (the loss's backward):\n"
    )
    for k, v in parts.items():
        print(f"  {v / GIB:6.2f} GiB  {k}")
    print(f"  {total / GIB:6.2f} GiB  in all; the seed logged {SEED['measured_gib']} GiB active")
    target = SEED["measured_gib"] - logits / GIB
    print(
        f"\nLess the logits Kiln does not keep: {SEED['measured_gib']} - {logits / GIB:.2f} = {target:.2f} GiB "
        f"(+-10%: {0.9 * target:.1f} to {1.1 * target:.1f})"
    )
    for parallel in ("ddp", "fsdp"):
        est = estimate(cfg, Setting(micro_batch=6, world=SEED["world"], parallel=parallel))
        print(
            f"Kiln, {parallel}, compiled, fp32 master weights and AdamW state: {est.summary()}: "
            f"{est.gib / target - 1:+.1%} from {target:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=2048)
    parser.add_argument("--n-head", type=int, default=32)
    parser.add_argument("--n-kv-head", type=int, default=8)
    parser.add_argument("--d-ff", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny input through every part that prints the table (tests/test_bench.py); figures meaningless",
    )
    args = parser.parse_args()
    if args.quick:  # eager only: inductor's C++ build alone takes minutes cold
        vars(args).update(d_model=64, n_head=2, n_kv_head=1, d_ff=128, seq=16, batch=1, modes="eager")
    cfg = ModelConfig(
        family="llama",
        vocab_size=SEED["vocab"],
        seq_len=args.seq,
        n_layer=1,
        n_head=args.n_head,
        n_kv_head=args.n_kv_head,
        d_model=args.d_model,
        d_ff=args.d_ff,
        rope_theta=500000.0,
    )
    modes = tuple(args.modes.split(","))
    results = table(cfg, args.batch, modes)
    saved, peak = loss_bytes_per_logit(64, 256, "eager") if args.quick else loss_bytes_per_logit()
    print(
        f"\ntorchtitan's compiled loss on bf16 logits: keeps {saved:.2f} B a logit for backward; its backward "
        f"allocates {peak:.2f} B a logit more (the gradient)"
    )
    seeds = (args.d_model, args.n_head, args.n_kv_head, args.d_ff) == (2048, 32, 8, 8192)
    key = ("transformers LlamaDecoderLayer", "bf16", "eager" if args.quick else "inductor")
    if (seeds or args.quick) and key in results:
        seed_000(
            results[key]["per token"],
            saved + peak,
            hf_outside_per_token(model_config({"flavour": "llama3.2-1b"}, vocab_size=SEED["vocab"], seq_len=args.seq)),
        )


if __name__ == "__main__":
    main()
