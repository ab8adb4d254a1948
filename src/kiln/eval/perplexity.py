"""Held-out language-modelling metrics, and the unigram baseline every trained model must beat.

Loss is the mean next-token cross-entropy (nats) over validation rows. Bits per byte divides the
total bits by the UTF-8 bytes the tokens stand for, which makes models with different tokenizers
comparable: bpb = loss / ln 2 * tokens / bytes.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from kiln.data.loader import ShardRows, eval_batches


@torch.no_grad()
def val_rows_loss(model: torch.nn.Module, rows: ShardRows, micro_batch: int, max_batches: int) -> tuple[float, int]:
    """(mean loss, number of target tokens) over the first max_batches batches of the val split."""
    device = next(model.parameters()).device
    total, n = 0.0, 0
    for batch in eval_batches(rows, micro_batch, max_batches):
        batch = batch.to(device)
        logits, _ = model(batch[:, :-1])
        total += torch.nn.functional.cross_entropy(
            logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="sum"
        ).item()
        n += batch[:, 1:].numel()
    return total / n, n


def unigram_loss(train_tokens: np.ndarray, rows: ShardRows, vocab_size: int, micro_batch: int,
                 max_batches: int) -> float:
    """Cross-entropy on the same val targets of a unigram model fit to the train split
    (add-one smoothed): the loss of a model that has learnt token frequencies and nothing else."""
    counts = np.bincount(train_tokens, minlength=vocab_size).astype(np.float64) + 1.0
    log_probs = np.log(counts / counts.sum())
    total, n = 0.0, 0
    for batch in eval_batches(rows, micro_batch, max_batches):
        targets = batch[:, 1:].numpy().ravel()
        total -= log_probs[targets].sum()
        n += len(targets)
    return total / n


def bits_per_byte(loss: float, tokens: int, n_bytes: int) -> float:
    return loss / math.log(2) * tokens / n_bytes
