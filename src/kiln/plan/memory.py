"""Peak memory per GPU of a training step, predicted from a config's shapes alone (torch-free: `kiln plan`
prices a run on a login node; the smoke preflight prints it beside the measured peak).

What a step holds at its peak, per rank (N parameters, tied weights once; W ranks; B x T = micro_batch
x seq_len tokens, C = d_model, K = key/value width n_kv_head x head dim, F = d_ff, V = padded vocab,
L layers):

- weights, gradients, AdamW's two moments: 4 + 4 + 8 bytes per parameter, fp32 (bf16 autocast keeps
  fp32 master weights); FSDP divides all three by W (HSDP on several nodes: by the ranks of a node,
  kiln.train.parallel.device_mesh). DDP on several ranks adds its gradient buckets
  (4N; Kiln's DDP makes the gradients views into them, so they are the gradients' memory from the
  first step on). FSDP with gradient accumulation keeps every gradient whole (4N, not divided by
  W) from the first micro-batch's backward to the last one's reduce-scatter: kiln.train.parallel.
  grad_sync turns FSDP2's requires_gradient_sync off for all but the last micro-batch, and FSDP2's
  post-backward then keeps each block's unsharded gradient, upcast to the fp32 reduce dtype
  (FSDPParam.to_accumulated_grad_if_needed), instead of reduce-scattering it. DDP's no_sync
  accumulates into the buckets it already has: nothing more.
- under train.optimizer muon, the blocks' matrices (L x layer_params' matmul weights) keep one
  momentum, 4 bytes, instead of AdamW's 8; the rest keeps AdamW's (kiln.train.optim). On several
  ranks each matrix's Newton-Schulz runs on one rank (kiln.train.muon) and the results, in the step's
  precision (a = 2 bytes in bf16, 4 in fp32), are in flight together during the optimizer step: under
  DDP every matrix's (a bytes each), under FSDP the owned matrices whole, their updates and the rows
  coming back (~3a bytes each / W). One rank updates
  one matrix at a time: its few temporaries are not counted.
- activations, what autograd keeps from the forward pass for backward, per layer per token, counted
  tensor by tensor from the models (tests/unit/plan/test_memory.py checks the totals against torch's CPU
  profiler). Each family's count is its spec's (kiln.model.<family>.spec: block_activation_bytes,
  final_norm_bytes, block_weights); gpt2's and llama's, with a = 2 bytes (bf16 autocast) or 4 (fp32):
    eager   gpt2  8C + a(6C + 2F)         the fp32 residual stream before each LayerNorm (2 x 4C);
                                          both LayerNorm outputs, q|k|v, the attention output, the
                                          MLP's two F-wide tensors
            llama 16C + a(nC + 2C + 2K + 4F) RMSNorm keeps its fp32 input and normalised input (2 x 2
                                          x 4C); its output is cast once per matmul under autocast
                                          (n = 5: q, k, v, gate, up) or kept once in fp32 (n = 2);
                                          q and the attention output (2C), k and v (2K), SwiGLU's
                                          gate, silu, up and product (4F)
    compiled gpt2 4C + a(7C + 2F)         inductor's min-cut partitioner keeps the block input and
            llama 4C + a(5C + 2K + 3F)    matmul-sized tensors, recomputing norms and pointwise ops
                                          (measured with aot_eager_decomp_partition, the same
                                          partitioner; identical to inductor's on the CPU)
  plus a few bytes per token (norm statistics, attention's log-sum-exp: 4 x heads). These are what
  autograd saves, byte for byte, for Kiln's block and for transformers' LlamaDecoderLayer alike
  (docs/benchmarks.md, "Seed 000's memory"; tests/unit/plan/test_memory.py pins them). Seed 000's 70.2 GiB under torchtitan is
  the same count in all-bf16 training (8 bytes a parameter of states, a bf16 residual stream: 2C
  where Kiln keeps 4C) plus its whole logits; Kiln's fp32 weights and AdamW state are what put the
  seed's setting over an H100 under DDP, not its blocks. Under bf16
  autocast (without FSDP) each matmul also keeps its bf16 weight copy, 2 bytes per weight, until its
  backward. A checkpointed block keeps only its input (4C, fp32) and recomputes the rest when
  backward reaches it (train.activation_checkpointing: full, every block; selective, every other).
- the loss (kiln.model.loss): the final norm's output, and one chunk's logits at a time in backward
  (bf16 logits, their fp32 copy, log-softmax and gradients: ~LOSS_BYTES_PER_LOGIT per logit); over
  several chunks under bf16, the fp32 sum of their head gradients.
- model.document_mask's mask (kiln.model.documents), built once per forward and kept by every layer's
  attention until the last backward: dense, a (B, 1, T, T) additive mask of a bytes an entry (the CPU,
  or a GPU with attention dropout: 128 MiB a row at 8k in bf16); on a GPU, flex attention's block
  mask, four (B, 1, T/128, T/128) int32 tile tables and four counts, and the rows' int32 document ids
  its mask function reads (~100 KiB a row at 8k). gpt2's embedding also keeps the restarted positions,
  8 bytes a token.
- a CPU's compiled step's attention (kiln.model.sdpa.blockwise_causal, rows of at most 1,024): every
  layer keeps its blocks' probabilities, fp32 and their bf16 copy, 6 bytes an entry (blockwise_bytes:
  40 MB a layer for the embedded default's 16 rows of 512, 2 heads).

The peak is walked through the step: the start of backward (every activation, the head's gradient,
the loss chunk), each layer's backward (activations freed, gradients arriving, a checkpointed block's
recompute), and the optimizer step (all gradients). Eager figures are what a CPU run and an eager GPU
run hold; compiled ones are what train holds on a GPU (compile auto). Neither counts the CUDA context
(~0.5 GiB, outside torch's allocator) or fragmentation: FIT_FRACTION leaves room for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kiln.config.models import ModelConfig, blockwise_attention, loss_chunk_rows, query_blocks
from kiln.config.train_sections import TrainSection
from kiln.model import registry

GIB = 2**30
AC_MODES = ("none", "full", "selective")  # train.activation_checkpointing
FLEX_TILE = 128  # flex attention's block mask tile (create_block_mask's BLOCK_SIZE)
LOSS_BYTES_PER_LOGIT = 12  # a chunk's logits in backward: their tensors at once (measured, bf16 and fp32 alike)
FIT_FRACTION = 0.9  # of a GPU's memory a step may plan to use: the CUDA context, NCCL and fragmentation


def checkpointed_blocks(mode: str, n_layer: int) -> list[int]:
    """Indices of the blocks whose activations `mode` recomputes in backward: every block (full), the
    2nd, 4th, ... (selective: torchtitan's layer-level selective AC), none. kiln.train.parallel
    applies it; this module counts the same blocks."""
    if mode not in AC_MODES:
        raise ValueError(f"train.activation_checkpointing: {mode!r} is not one of {', '.join(AC_MODES)}")
    return {"none": [], "full": list(range(n_layer)), "selective": list(range(1, n_layer, 2))}[mode]


@dataclass(frozen=True)
class Setting:
    """The train settings memory depends on (besides the model's shape)."""

    micro_batch: int
    world: int = 1
    nnodes: int = 1  # FSDP on several nodes is HSDP: sharded across a node's world // nnodes ranks
    parallel: str = "ddp"
    activation_checkpointing: str = "none"
    bf16: bool = True
    compiled: bool = True
    cuda: bool = True  # on a CPU, attention with dropout runs SDPA's math kernel (below)
    grad_accum: int = 1  # micro-batches per optimizer step on each rank (FSDP: whole gradients between them)
    optimizer: str = "adamw"  # train.optimizer: muon keeps one moment for the blocks' matrices, not two
    loss_rows: int | None = None  # rows per chunk of the loss (loss_rows below); None: LOSS_CHUNK_ELEMENTS' chunks


@dataclass(frozen=True)
class Estimate:
    """Bytes per rank at the step's peak, by part, and when in the step it falls."""

    parts: dict[str, int] = field(default_factory=dict)
    peak_at: str = ""

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def gib(self) -> float:
        return self.total / GIB

    def summary(self) -> str:
        """e.g. "74.71 GiB (weights 3.88, optimizer 7.75, ...; at backward start)"; MiB under 1 GiB."""
        unit, scale = ("GiB", GIB) if self.total >= GIB else ("MiB", 2**20)
        parts = ", ".join(f"{name} {b / scale:.2f}" for name, b in self.parts.items() if b)
        return f"{self.total / scale:.2f} {unit} ({parts}; at {self.peak_at})"


def layer_params(cfg: ModelConfig) -> tuple[int, int]:
    """(matmul weights, all parameters) of one block (the family's spec: kiln.model.<family>.spec)."""
    return registry.get(cfg.family).spec.block_weights(cfg)


def optimizer_state_bytes(cfg: ModelConfig, optimizer: str = "adamw") -> int:
    """Bytes of the optimizer's state for the whole model, fp32: AdamW's two moments for every
    parameter, or, under muon, one momentum for each block's matrices (kiln.train.optim.hidden_matrices)
    and AdamW's two for the rest."""
    n = cfg.num_params(non_embedding=False)
    if optimizer == "muon":
        hidden = cfg.n_layer * layer_params(cfg)[0]
        return 4 * hidden + 8 * (n - hidden)
    return 8 * n


def layer_activation_bytes(cfg: ModelConfig, tokens: int, bf16: bool, compiled: bool, cuda: bool = True) -> int:
    """What one block keeps for backward at `tokens` tokens (its weight copies not included)."""
    return tokens * registry.get(cfg.family).spec.block_activation_bytes(cfg, bf16, compiled, cuda)


def blockwise_bytes(cfg: ModelConfig, micro_batch: int, bf16: bool) -> int:
    """What one layer's blockwise_causal (a CPU's compiled step, kiln.model.sdpa) keeps beyond SDPA's
    q, k, v and output, as inductor's partitioner keeps it: each block's probabilities in fp32 (for
    softmax's backward) and again in the autocast dtype (for the product with v; the same tensor in
    fp32), and its keys in that dtype, for every row and head."""
    a = 2 if bf16 else 4
    entry = 4 + a if bf16 else 4  # fp32 probabilities (and their bf16 copy)
    per_head = sum((end - start) * end * entry + a * cfg.head_dim * end for start, end in query_blocks(cfg.seq_len))
    return micro_batch * cfg.n_head * per_head


def document_mask_bytes(cfg: ModelConfig, micro_batch: int, bf16: bool, cuda: bool) -> int:
    """What model.document_mask keeps through a step's forward and backward (module docstring); 0 without it."""
    if not cfg.document_mask:
        return 0
    B, T = micro_batch, cfg.seq_len
    positions = 8 * B * T if registry.get(cfg.family).spec.default_max_positions(cfg) is not None else 0
    if cuda and cfg.dropout == 0:  # flex attention (kiln.model.documents.DocumentMask.of)
        tiles = -(-T // FLEX_TILE)
        return B * 4 * (4 * tiles * tiles + 4 * tiles + T) + positions
    return (2 if bf16 else 4) * B * T * T + positions


def estimate(cfg: ModelConfig, s: Setting) -> Estimate:
    """Peak bytes per rank of one training step of `cfg` under setting `s` (module docstring)."""
    tokens, L, C, V = s.micro_batch * cfg.seq_len, cfg.n_layer, cfg.d_model, cfg.vocab_size
    n = cfg.num_params(non_embedding=False)
    fsdp = s.parallel == "fsdp" and s.world > 1
    shard = s.world // s.nnodes if fsdp else 1
    mat, per_layer = layer_params(cfg)
    ckpt = set(checkpointed_blocks(s.activation_checkpointing, L))
    full_layer = layer_activation_bytes(cfg, tokens, s.bf16, s.compiled, s.cuda)
    if blockwise_attention(cfg, cuda=s.cuda, compiled=s.compiled):
        full_layer += blockwise_bytes(cfg, s.micro_batch, s.bf16)
    kept = [4 * C * tokens if i in ckpt else full_layer for i in range(L)]  # a checkpointed block: its input
    casts = 2 * mat if s.bf16 and not fsdp else 0  # a block's bf16 weight copies, kept by its matmuls
    kept_casts = [0 if i in ckpt else casts for i in range(L)]
    head = V * C
    # Outside the blocks: the ids (int64), the final norm (LayerNorm: its input; RMSNorm: input and
    # normalised input) and its output, which the chunked loss keeps; dropout masks of the embedding (gpt2).
    outside = tokens * (8 + registry.get(cfg.family).spec.final_norm_bytes(cfg))
    if cfg.dropout > 0 and not s.compiled:
        outside += tokens * C
    rows = min(tokens, s.loss_rows or loss_chunk_rows(V))
    # One chunk's logits and their gradients; the chunk's bf16 head copy; with several chunks under bf16,
    # the fp32 sum of their head gradients, and under FSDP2 the fp32 copy of its bf16 head that the sum
    # needs, held from the loss's forward (kiln.model.loss: 2 and 8 bytes an element more than the
    # bf16 sum's, measured); the gradient of the final norm's output, (B*T, C) fp32, and the slice's
    # full-size gradient it is summed from.
    fp32_sum = (8 if fsdp else 2) * head if s.bf16 and rows < tokens else 0
    loss_chunk = LOSS_BYTES_PER_LOGIT * rows * V + (2 * head if s.bf16 else 0) + fp32_sum + 8 * tokens * C
    mask = document_mask_bytes(cfg, s.micro_batch, s.bf16, s.cuda)  # every layer's attention keeps it

    states = {"weights": 4 * n // shard, "optimizer": optimizer_state_bytes(cfg, s.optimizer) // shard}
    buckets = 4 * n if s.parallel == "ddp" and s.world > 1 else 0  # DDP: gradients live in its buckets
    fsdp_buffers = 0
    if fsdp:  # two blocks gathered (this one and the prefetch), the root's tables, a block's gradients
        pb = 2 if s.bf16 else 4
        fsdp_buffers = 2 * per_layer * pb + (n - L * per_layer) * pb + per_layer * (pb + 4)

    def grad(count: int) -> int:  # gradient bytes of `count` parameters, unless they live in DDP's buckets
        return 0 if buckets else 4 * count // shard

    # FSDP accumulating (module docstring): every gradient whole and fp32 through each backward but the
    # last one's, where blocks reduce-scatter one by one; so the peak is an earlier micro-batch's, with
    # no sharded gradient yet.
    accumulated = 4 * n if fsdp and s.grad_accum > 1 else 0
    acts, copies, grads = sum(kept) + outside, sum(kept_casts), grad(head)
    candidates = {
        "backward start": {
            "activations": acts,
            "weight copies": copies,
            "gradients": 0 if accumulated else grads,
            "accumulated gradients": accumulated,
            "loss chunk": loss_chunk,
            "document mask": mask,
        }
    }
    for i in reversed(range(L)):
        recompute = full_layer if i in ckpt else 0
        # + the gradients flowing through the block: of its output and of its input, (B*T, C) fp32
        candidates[f"block {i} backward"] = {
            "activations": acts + recompute + 8 * C * tokens,
            "weight copies": copies + (casts if i in ckpt else 0),
            "gradients": 0 if accumulated else grads + grad(per_layer),
            "accumulated gradients": accumulated,
            "document mask": mask,
        }
        acts, copies, grads = acts - kept[i], copies - kept_casts[i], grads + grad(per_layer)
    muon = 0
    if s.optimizer == "muon" and s.world > 1:  # the Newton-Schulz results in flight (module docstring)
        a = 2 if s.bf16 else 4
        muon = 3 * a * L * mat // shard if fsdp else a * L * mat
    candidates["optimizer step"] = {"gradients": grad(n), "Muon results": muon}
    peak_at = max(candidates, key=lambda k: sum(candidates[k].values()))
    parts = {**states, "DDP buckets": buckets, "FSDP gathers": fsdp_buffers, **candidates[peak_at]}
    return Estimate(parts={k: v for k, v in parts.items() if v}, peak_at=peak_at)


def setting_of(
    train: TrainSection,
    *,
    cuda: bool = True,
    world: int | None = None,
    bf16: bool | None = None,
    compiled: bool | None = None,
    grad_accum: int = 1,
) -> Setting:
    """The Setting a validated train section means: on a GPU by default (`kiln plan`: bf16 as
    train.precision says, compiled unless train.compile is false), or as a run decided it (smoke).
    grad_accum: micro-batches per step (kiln.config.batch.split_batch's, which needs shard.seq_len)."""
    return Setting(
        grad_accum=grad_accum,
        micro_batch=train.micro_batch,
        world=world or train.ranks,
        nnodes=train.nnodes,
        parallel=train.parallel,
        activation_checkpointing=train.activation_checkpointing,
        bf16=train.precision in ("bf16", "auto") if bf16 is None else bf16,  # auto is bf16 on a GPU
        compiled=(train.compile is True or (train.compile == "auto" and cuda)) if compiled is None else compiled,
        cuda=cuda,
        optimizer=train.optimizer,
    )


def fits(est: Estimate, memory_gib: float) -> bool:
    return est.total <= FIT_FRACTION * memory_gib * GIB


def loss_rows(cfg: ModelConfig, s: Setting, memory_gib: float) -> int | None:
    """Rows per chunk of the training loss (kiln.model.loss) for the step `s` on a GPU of memory_gib:
    the whole micro-batch at once where the step fits with all its logits, None (chunks of
    LOSS_CHUNK_ELEMENTS logits) where it does not. Chunks cost speed: the head's forward again in
    backward, and a pass over its weight (bf16 cast, fp32 gradient add) per chunk; on an H200 GPT-2
    124M ran 352k tok/s in 4 chunks against 418k whole at batch 16, 453k against 508k at 64, with
    27.5 GiB at its peak (docs/benchmarks.md, "Loss chunks on the H200"). On a CPU the chunks stay:
    there they were the faster (0.65-0.70x the time of the whole loss at V 32,768, their logits
    staying in cache) besides the smaller."""
    whole = replace(s, loss_rows=s.micro_batch * cfg.seq_len)
    return whole.loss_rows if s.cuda and fits(estimate(cfg, whole), memory_gib) else None


def largest_micro_batch(cfg: ModelConfig, s: Setting, memory_gib: float, most: int = 8) -> tuple[int, Estimate]:
    """The largest micro-batch up to `most` whose step `s` fits in FIT_FRACTION of memory_gib, the loss
    whole or in chunks as loss_rows decides at that size, and its estimate (1 row's when none fits)."""
    for micro in range(most, 0, -1):
        t = replace(s, micro_batch=micro)
        est = estimate(cfg, replace(t, loss_rows=loss_rows(cfg, t, memory_gib)))
        if fits(est, memory_gib):
            return micro, est
    return 1, est


def changes_to_fit(cfg: ModelConfig, s: Setting, memory_gib: float, limit: int = 4) -> list[tuple[str, Estimate]]:
    """Settings that bring the step within FIT_FRACTION of memory_gib, cheapest first: single changes
    (selective, then full activation checkpointing; a smaller micro-batch, the global batch kept by
    more accumulation; FSDP across several ranks), then the first combination that fits."""
    more_recompute = ("none", "selective", "full")
    ac_order = more_recompute[more_recompute.index(s.activation_checkpointing) :]
    micros = [m for m in range(s.micro_batch, 0, -1) if s.micro_batch % m == 0]  # keeps batch_tokens whole
    parallels = [s.parallel] + (["fsdp"] if s.world > 1 and s.parallel != "fsdp" else [])

    def describe(t: Setting) -> str:
        out = []
        if t.activation_checkpointing != s.activation_checkpointing:
            out.append(f"train.activation_checkpointing: {t.activation_checkpointing}")
        if t.micro_batch != s.micro_batch:
            out.append(
                f"train.micro_batch: {t.micro_batch} ({s.micro_batch // t.micro_batch}x the gradient "
                "accumulation keeps train.batch_tokens)"
            )
        if t.parallel != s.parallel:
            out.append(f"train.parallel: {t.parallel}")
        return " + ".join(out)

    singles = [replace(s, activation_checkpointing=m) for m in ac_order[1:]]

    def smaller(m: int) -> Setting:  # micro-batch m, the global batch kept by more accumulation
        return replace(s, micro_batch=m, grad_accum=s.grad_accum * s.micro_batch // m)

    singles += [smaller(m) for m in micros[1:2]] + [replace(s, parallel=p) for p in parallels[1:]]
    found = [(describe(t), e) for t in singles if fits(e := estimate(cfg, t), memory_gib)]
    if not found:
        for ac in ac_order:
            for micro in micros:
                for parallel in parallels:
                    t = replace(smaller(micro), activation_checkpointing=ac, parallel=parallel)
                    if t != s and fits(e := estimate(cfg, t), memory_gib):
                        return [(describe(t), e)]
    return found[:limit]


def fit_report(cfg: ModelConfig, s: Setting, gpu_name: str, memory_gib: float) -> dict:
    """The estimate and whether it fits on a GPU of memory_gib, with what to change when it does not
    (the plain form `kiln plan --json` prints and kiln.plan.tables renders), with the loss whole
    where it fits (loss_rows)."""
    s = replace(s, loss_rows=loss_rows(cfg, s, memory_gib))
    est = estimate(cfg, s)
    ok = fits(est, memory_gib)
    return {
        "gib_per_gpu": est.gib,
        "parts_gib": {k: v / GIB for k, v in est.parts.items()},
        "peak_at": est.peak_at,
        "assumes": f"micro-batch {s.micro_batch} x {cfg.seq_len}, {'bf16' if s.bf16 else 'fp32'}, "
        f"{'compiled' if s.compiled else 'eager'}, activation checkpointing {s.activation_checkpointing}, "
        f"{s.world} rank{'s' if s.world > 1 else ''} ({s.parallel})"
        + (f", {s.grad_accum} micro-batches a step" if s.grad_accum > 1 else "")
        + (", the loss whole" if s.loss_rows else ", the loss in chunks"),
        "gpu": gpu_name,
        "gpu_memory_gib": memory_gib,
        "usable_gib": FIT_FRACTION * memory_gib,
        "fits": ok,
        "changes": []
        if ok
        else [{"set": what, "gib_per_gpu": e.gib} for what, e in changes_to_fit(cfg, s, memory_gib)],
    }
