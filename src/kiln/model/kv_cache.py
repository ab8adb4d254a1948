"""Key/value cache for decoding: every layer's keys and values of the tokens seen so far, so that a
new token costs one position's forward instead of the whole sequence's.

Shapes: L layers, B batch, K key/value heads, S cache slots, D head dim, T new tokens.

Batched prompts of different lengths are left-padded to one width, so every row appends its next
token at the same slot and one (L, B, K, S, D) tensor holds them all. Row b's first pad[b] slots
hold padding, and padding cannot change the row's result:
- positions count from the row's first real token (slot - pad[b]): learned positions and RoPE
  see the same positions as for the prompt alone;
- no real query attends to a pad slot. A pad query attends to itself only: a query with every key
  masked would give NaN, and a NaN value in a pad slot poisons the masked sum of every later query
  (0 * NaN is NaN), whereas a finite one is simply weighted 0.
The explicit mask is skipped where SDPA's own modes are exact: no padding, and either a first
forward (`is_causal`, as in training) or a single new token (it attends to every slot).
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layer: int, pads: list[int], max_len: int, device: torch.device | str = "cpu"):
        """pads: left-padding slots of each row, known on the host (so no device read tells whether
        any row is padded). max_len: slots. device: the model's."""
        self.n_layer, self.max_len = n_layer, max_len
        self.pad = torch.tensor(pads, dtype=torch.long, device=device)  # (B,)
        self.padded = any(pads)
        self.k: torch.Tensor | None = None  # (L, B, K, S, D), allocated by the first update (its dtype)
        self.v: torch.Tensor | None = None
        self.length = 0  # slots filled by finished forwards
        self.mask: torch.Tensor | None = None  # (B, 1, T, length + T), True: may attend; None: see is_causal
        self.is_causal = False

    @classmethod
    def for_model(cls, model: torch.nn.Module, pads: list[int], max_len: int) -> KVCache:
        """A cache for max_len slots on the model's device, which must fit the model's context:
        positions past the training seq_len have no learned row (GPT) or RoPE table entry (Llama)."""
        if max_len > model.config.seq_len:
            raise ValueError(f"a cache of {max_len} slots exceeds the model's {model.config.seq_len} positions")
        return cls(model.config.n_layer, pads, max_len, next(model.parameters()).device)

    def begin(self, T: int) -> torch.Tensor:
        """Set the attention mask for the next T tokens; their positions (B, T)."""
        start, end = self.length, self.length + T
        if end > self.max_len:
            raise ValueError(f"{end} tokens exceed the cache's {self.max_len} slots")
        device = self.pad.device
        slots = torch.arange(start, end, device=device)  # (T,) the new tokens' slots
        if not self.padded and (start == 0 or T == 1):
            self.mask, self.is_causal = None, T > 1
        else:
            keys = torch.arange(end, device=device)  # (S,)
            causal = keys[None, :] <= slots[:, None]  # (T, S)
            real = keys[None, :] >= self.pad[:, None]  # (B, S)
            itself = keys[None, :] == slots[:, None]  # (T, S)
            self.mask = ((causal[None] & real[:, None]) | itself[None])[:, None]  # (B, 1, T, S)
            self.is_causal = False
        return (slots[None, :] - self.pad[:, None]).clamp(min=0)  # (B, T); pad slots read position 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one layer's keys and values (B, K, T, D) of the new tokens; return all of that
        layer's so far (B, K, length + T, D)."""
        if self.k is None:
            B, K, _, D = k.shape
            self.k = k.new_zeros(self.n_layer, B, K, self.max_len, D)
            self.v = torch.zeros_like(self.k)
        end = self.length + k.size(2)
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, :, :, self.length : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def commit(self, T: int) -> None:
        """The forward of T tokens has gone through every layer: they are part of the cache."""
        self.length += T
