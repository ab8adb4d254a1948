"""train.init_from: start a run from another model's weights (continued training, mid-training on
other data, more steps than a finished run had), never by resuming that run's checkpoints.

A source is one of
    {run: NAME}             results/NAME/train: its final weights (model.safetensors); with
                            optimizer: true, the AdamW state of its newest checkpoint
    {checkpoint: FOLDER}    a checkpoint folder (kiln.train.checkpoint); optimizer: true takes its AdamW state
    {hf: FOLDER}            a Hugging Face folder (kiln.hf.load): an export of Kiln's, or a stock
                            GPT-2, Llama or Qwen2 checkpoint (kiln.config.hf_source); weights only

The schedule, steps, data and seed are the new run's own; its model shape must be the source's (an
error names the first weight that differs), and so must its tokenizer where the source records it.
The vocabulary is the one exception to the same shape. Kiln pads a run's vocabulary to a multiple
of 64 after its special tokens, whereas a stock checkpoint keeps its own (GPT-2: 50,257 rows; a Kiln
run on GPT-2's tokenizer has 50,304). A source with fewer embedding (and head) rows than this run's
model has its rows copied into the first ones, the ids they share, and the rows beyond, which no
source token ever trained, start at the mean of the source's rows (Hewitt, "Initializing New Word
Embeddings for Pretrained Language Models", 2021: a new token then neither dominates the softmax
nor sits far off the embeddings the blocks were trained on). The source's own rows are never cut:
a source with more rows than this run is an error. An export of the continued run leaves the padding
behind where its tokenizer is an hf source's (the source's rows, and the ones appended for roles the
run uses: kiln.data.tokenizer.export_vocab_size), else has the run's padded vocabulary, which
transformers loads as any other size. With optimizer: true the rows must
match exactly (the moments are per row).

What the source is goes into the fingerprint (`identity`: the sha256 of its weights file), so a
source that is retrained restarts the runs that continue it rather than resume them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from kiln import hf, layout
from kiln.config.train_sections import TrainSection
from kiln.errors import KilnError
from kiln.io import read_json, sha256_file
from kiln.model.build import WEIGHTS_FILE, load_model
from kiln.train import checkpoint, parallel

log = logging.getLogger("kiln.init_from")

KINDS = ("run", "checkpoint", "hf")


@dataclass(frozen=True)
class InitSource:
    kind: str
    folder: Path  # what is read: a train folder, a checkpoint folder or an HF export
    optimizer: bool

    @classmethod
    def of(cls, spec: dict, results: str | Path = layout.RESULTS) -> "InitSource":
        kind = next(k for k in KINDS if k in spec)
        return cls(kind, layout.init_folder(spec, results), bool(spec.get("optimizer")))

    def describe(self) -> str:
        return f"{self.kind} {self.folder}" + (" (weights and optimizer state)" if self.optimizer else " (weights)")

    def _checkpoint_folder(self) -> Path:
        if self.kind == "checkpoint":
            return self.folder
        newest = self._newest_or_none()
        if newest is None:
            raise KilnError(
                f"train.init_from: {self.folder / layout.CHECKPOINTS} holds no complete checkpoint to take "
                "the optimizer state from (optimizer: true)"
            )
        return newest

    def identity(self) -> str:
        """sha256 of what the weights are read from (and the checkpoint, with the optimizer state)."""
        if self.kind == "checkpoint":
            files = [self.folder / checkpoint.MANIFEST]
        else:
            files = [self.folder / WEIGHTS_FILE]
            if self.optimizer:
                files.append(self._checkpoint_folder() / checkpoint.MANIFEST)
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise KilnError(f"train.init_from: {', '.join(missing)} not found (is {self.folder} a {self.kind}?)")
        return hashlib.sha256("".join(sha256_file(f) for f in files).encode()).hexdigest()

    def weights(self) -> dict[str, torch.Tensor]:
        """The source's model state dict on the CPU, under Kiln's parameter names."""
        if self.kind == "hf":
            return hf.load(self.folder).state_dict()
        if self.kind == "run":
            return load_model(self.folder).state_dict()
        return checkpoint.load_weights(self.folder)[0]

    def optimizer_state(self) -> dict:
        """The full-format AdamW state of the source's checkpoint."""
        folder = self._checkpoint_folder()
        state = checkpoint.load_full(folder)
        if "optimizer" not in state:
            raise KilnError(
                f"train.init_from: {folder} is a sharded checkpoint; taking its optimizer state is not "
                "supported: drop optimizer: true, or continue from a full-format checkpoint"
            )
        return state["optimizer"]

    def tokenizer_sha256(self) -> str | None:
        """The tokenizer the source was trained with, where it records it."""
        if self.kind == "hf":
            path = self.folder / "tokenizer.json"
            return sha256_file(path) if path.is_file() else None
        folder = self.folder if self.kind == "checkpoint" else self._newest_or_none()
        if folder is None:
            return None
        return read_json(folder / checkpoint.MANIFEST)["fingerprint"].get("tokenizer")

    def _newest_or_none(self) -> Path | None:
        found = checkpoint.kept(self.folder / layout.CHECKPOINTS)
        return found[-1][1] if found else None


def source_last_lr(source: InitSource) -> float:
    """The LR the source's last step trained at: what train.init_from.warmup_from: source ramps from.
    A run's is that of its last logged step (its train/metrics.jsonl; a torn last line, a job killed
    mid-write, is skipped); a checkpoint's is in its state ("lr"). An hf source records none
    (kiln.config.rules refuses it)."""
    if source.kind == "checkpoint":
        state = checkpoint.read_state(source.folder)
        if state.get("lr") is None:
            why = "it was saved at step 0" if "lr" in state else "it was written before Kiln recorded the LR"
            raise KilnError(
                f"train.init_from.warmup_from: source: checkpoint {source.folder} records no LR ({why}); "
                "give the LR as a number"
            )
        return float(state["lr"])
    path = source.folder / layout.METRICS
    lrs = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "lr" in record:
            lrs.append(float(record["lr"]))
    if not lrs:
        raise KilnError(
            f"train.init_from.warmup_from: source: {path} has no logged LR (has {source.describe()} trained?); "
            "give the LR as a number"
        )
    return lrs[-1]


def resolved_warmup(train: TrainSection, results: str | Path) -> TrainSection:
    """The train section with warmup_from: source replaced by the source's last LR (source_last_lr: a
    run's or a checkpoint's; the train stage calls it before anything reads the schedule); any other
    section unchanged."""
    spec = train.init_from
    if spec is None or spec.warmup_from != "source":
        return train
    lr = source_last_lr(InitSource.of(spec.as_dict(), results))
    log.info("train.init_from.warmup_from: source: the warmup ramps from %.6g, the source's last LR", lr)
    return train.replace(init_from=spec.replace(warmup_from=lr))


def check_same_shape(source: InitSource, theirs: dict[str, torch.Tensor], ours: dict[str, torch.Tensor]) -> None:
    """An error naming the first weight whose name or shape differs between source and model."""
    missing, extra = sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours))
    if missing or extra:
        raise KilnError(
            f"train.init_from: {source.describe()} is another architecture than this run's model: "
            f"{len(missing)} weights missing ({', '.join(missing[:3])}), {len(extra)} not in this model "
            f"({', '.join(extra[:3])}); set model: to the source's shape"
        )
    for name in ours:
        if tuple(theirs[name].shape) != tuple(ours[name].shape):
            raise KilnError(
                f"train.init_from: {source.describe()}: weight {name} is {tuple(theirs[name].shape)}, "
                f"this run's model has {tuple(ours[name].shape)}; set model: to the source's shape "
                "(and tokenizer: to its tokenizer)"
            )


def fit_vocabulary(
    source: InitSource, theirs: dict[str, torch.Tensor], ours: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The source's weights with its embedding and head grown to this run's vocabulary rows: its own
    rows first, the mean of them beyond (see the module's docstring). Anything else is left to
    check_same_shape."""
    fitted = dict(theirs)
    head, embedding = theirs.get("lm_head.weight"), theirs.get("wte.weight")
    tied = head is not None and embedding is not None and head.data_ptr() == embedding.data_ptr()
    for name in ("wte.weight", "lm_head.weight"):
        if name not in theirs or name not in ours or (name == "lm_head.weight" and tied):
            continue
        rows, (want, width) = theirs[name].shape[0], ours[name].shape  # (V_source, C), (V, C)
        if source.optimizer or rows >= want or theirs[name].shape[1:] != (width,):
            continue
        log.info(
            "%s: %s has %d rows, this run %d: rows %d.. start at the mean row",
            source.describe(),
            name,
            rows,
            want,
            rows,
        )
        mean = theirs[name].mean(dim=0, keepdim=True)  # (1, C)
        fitted[name] = torch.cat([theirs[name], mean.expand(want - rows, width)])  # (V, C)
    if tied:
        fitted["lm_head.weight"] = fitted["wte.weight"]
    return fitted


def check_same_tokenizer(source: InitSource, shards_tokenizer: str | None, shards_source: str | None = None) -> None:
    """An error unless the source's tokenizer made the shards, or is the Hugging Face tokenizer the
    shards' one extends (tokenizer kind hf: the same ids, a role's token appended where it had none)."""
    theirs = source.tokenizer_sha256()
    if theirs and shards_tokenizer and theirs not in (shards_tokenizer, shards_source):
        raise KilnError(
            f"train.init_from: {source.describe()} was trained with another tokenizer (sha256 "
            f"{theirs[:12]}…) than this run's shards (sha256 {shards_tokenizer[:12]}…): token ids would "
            "mean other things; give this run the source's tokenizer (tokenizer: {kind: hf, path: ...})"
        )


def check_same_optimizer(source: InitSource, state: dict, optimizer) -> None:
    """An error unless the source's optimizer state is of this run's train.optimizer: Muon keeps a
    momentum_buffer for the blocks' matrices where AdamW keeps its moments."""
    parts = getattr(optimizer, "parts", [optimizer])  # kiln.train.optim.Optimizers, or one optimizer
    ours = "muon" if any(isinstance(p, torch.optim.Muon) for p in parts) else "adamw"
    theirs = "muon" if any("momentum_buffer" in s for s in state["state"].values()) else "adamw"
    if ours != theirs:
        raise KilnError(
            f"train.init_from.optimizer: {source.describe()} holds {theirs} state, and this run's "
            f"train.optimizer is {ours}: set train.optimizer: {theirs}, or drop optimizer: true (weights only)"
        )


def load_into(
    source: InitSource,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    shards_tokenizer: str | None,
    shards_source: str | None = None,
) -> None:
    """Load the source's weights (and AdamW state, when asked) into a fresh, parallelized model (every
    rank passes the whole state and keeps its part). The optimizer's hyperparameters stay this
    run's: only the moments and step counts are taken."""
    ours = model.state_dict()
    # A bias-free GPT exported to transformers' GPT-2 (which always has biases) carries zero ones.
    weights = {k: v for k, v in source.weights().items() if k in ours or not (k.endswith(".bias") and not v.any())}
    if "lm_head.weight" not in weights and "lm_head.weight" in ours:  # a tied head
        weights["lm_head.weight"] = weights["wte.weight"]
    weights = fit_vocabulary(source, weights, ours)
    check_same_shape(source, weights, ours)
    check_same_tokenizer(source, shards_tokenizer, shards_source)
    if not source.optimizer:
        parallel.load_full_model_state(model, weights)
        return
    settings = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    state = source.optimizer_state()
    check_same_optimizer(source, state, optimizer)
    parallel.load_full_state(model, optimizer, weights, state)
    for group, own in zip(optimizer.param_groups, settings):
        group.update(own)
