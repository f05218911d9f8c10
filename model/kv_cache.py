"""A key/value cache for generation: each layer's keys and values, in a fixed number of slots.

Allocated once and never reallocated. Static (models without a window): one slot per position up to
block_size, written in place (`index_copy_`); the attention mask (`model.gpt.causal_mask`) hides the slots
past each query. Rolling (models with a window): `window` slots used in turn, position p in slot p mod
window, so memory and a step's work stay the same however far generation goes (`slot_positions` says which
position each slot holds). A rolling cache's prefill attends over its own keys and keeps the last `window`.
Either way a decoding step has the same shapes every time, which lets `torch.compile` (and CUDA graphs) take
it once. The caller says where the tokens go; with document masking the cache keeps where each sequence's
current document began (`doc_start`).
"""

from __future__ import annotations

import torch
import torch.nn as nn


class KVCache(nn.Module):
    """Each layer's keys and values as buffers of their own (`keys_0`, `values_0`, ...): written in place
    whole, so a compiled step updates a slot without copying the cache (a write into a view of one shared
    tensor is copied whole by torch.export and inductor)."""

    def __init__(
        self,
        n_layer: int,
        batch_size: int,
        n_kv_head: int,
        slots: int,
        head_dim: int,
        device: torch.device | str,
        dtype: torch.dtype,
        rolling: bool = False,
    ):
        super().__init__()
        shape = (batch_size, n_kv_head, slots, head_dim)
        for layer in range(n_layer):  # zeros, not empty: masked slots get weight 0, but 0 * NaN is NaN
            self.register_buffer(f"keys_{layer}", torch.zeros(shape, device=device, dtype=dtype), False)
            self.register_buffer(f"values_{layer}", torch.zeros(shape, device=device, dtype=dtype), False)
        self.slots, self.rolling = slots, rolling
        self.register_buffer("doc_start", torch.zeros(batch_size, dtype=torch.long, device=device), False)

    @classmethod
    def for_model(cls, model: torch.nn.Module, batch_size: int, dtype: torch.dtype | None = None) -> KVCache:
        """Static with a slot per position (and a spare), or for a windowed model rolling with `window` slots
        (no more than block_size where positions end there: learned position embeddings)."""
        cfg = model.config
        weight = model.token_emb.weight
        # One spare slot, never written: a decoding step attends over 2 .. block_size slots, always fewer than
        # the cache's, which lets torch.export keep that count a symbol (model/decoding.py's `span`)
        slots = cfg.block_size + 1
        if cfg.window is not None:
            slots = cfg.window if cfg.unbounded_context else min(cfg.window, cfg.block_size)
        return cls(
            cfg.n_layer,
            batch_size,
            cfg.kv_heads,
            slots,
            cfg.head_dim,
            weight.device,
            dtype or weight.dtype,
            rolling=cfg.window is not None,
        )

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values (B, n_kv_head, slots, head_dim) of one layer."""
        return getattr(self, f"keys_{layer}"), getattr(self, f"values_{layer}")

    def update(
        self, layer: int, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write keys and values (B, n_kv_head, T, head_dim) into the slots of `positions` (T,) of `layer`;
        return what the queries attend over: that layer's keys and values for all slots, or for a rolling
        cache's prefill (T > 1) the new keys and values themselves (of which it keeps the last `slots`)."""
        cached_keys, cached_values = self.layer(layer)
        if not self.rolling:
            cached_keys.index_copy_(2, positions, keys)
            cached_values.index_copy_(2, positions, values)
            return cached_keys, cached_values
        kept = min(keys.size(2), self.slots)
        slots = positions[-kept:] % self.slots
        cached_keys.index_copy_(2, slots, keys[:, :, -kept:])
        cached_values.index_copy_(2, slots, values[:, :, -kept:])
        if keys.size(2) > 1:
            return keys, values
        return cached_keys, cached_values

    def slot_positions(self, position: torch.Tensor) -> torch.Tensor:
        """(slots,) the position whose keys each slot holds once `position` (1,) is written: the slot's own
        index in a static cache; in a rolling one the latest position it took, negative if none yet."""
        slots = torch.arange(self.slots, device=position.device)
        return position - (position - slots) % self.slots if self.rolling else slots
