"""A key/value cache for generation: each layer's keys and values in a fixed number of slots, and
which of them each new token may see.

Static (models without a window): one slot per position up to block_size, written in place.
Rolling (models with a window): `window` slots used in turn, position p in slot p mod window, so
memory and a step's work stay the same however far generation goes. Allocated once, so a decoding
step has the same shapes every time and compiles once. Two methods say where the tokens of one
forward pass go: `prefill` (a prompt from position 0, which attends over its own keys as training
does) or `step` (one token, which attends over the slots).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

if TYPE_CHECKING:  # windows and documents only: imported where a model has them
    from model.local_attention import LocalSpan

# a decoding step into a cache: (token (B,), position (1,)) -> logits (B, vocab)
Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# sampling/generate.py's `eager_step`: (model, cache) -> the eager step into that cache
EagerStep = Callable[[nn.Module, "KVCache"], Step]


class KVCache(nn.Module):
    """Each layer's keys and values as buffers of their own (`keys_0`, `values_0`, ...): written in
    place whole, so a compiled step updates a slot without copying the cache (a write into a view of
    one shared tensor is copied whole by torch.export and inductor)."""

    def __init__(self, n_layer, batch_size, n_kv_head, slots, head_dim, device, dtype, rolling):
        super().__init__()
        shape = (batch_size, n_kv_head, slots, head_dim)
        for layer in range(n_layer):
            # zeros, not empty: masked slots get weight 0, but 0 * NaN is NaN
            keys = torch.zeros(shape, device=device, dtype=dtype)
            self.register_buffer(f"keys_{layer}", keys, persistent=False)
            self.register_buffer(f"values_{layer}", torch.zeros_like(keys), persistent=False)
        self.slots = slots
        self.rolling = rolling
        # where each row's current document began (documents only)
        doc_start = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.register_buffer("doc_start", doc_start, persistent=False)

    @classmethod
    def for_model(cls, model: nn.Module, batch_size: int, dtype=None) -> KVCache:
        """Static with a slot per position and a spare, or rolling with `window` slots (no more than
        block_size where positions end there: learned position embeddings)."""
        cfg = model.config
        weight = model.token_emb.weight
        # the spare is never written: a decoding step attends over 2 .. block_size slots, always
        # fewer than the cache holds, which lets torch.export keep that count a symbol
        slots = cfg.block_size + 1
        if cfg.window is not None:
            slots = cfg.window if cfg.unbounded_context else min(cfg.window, cfg.block_size)
        shape = (cfg.n_layer, batch_size, cfg.kv_heads, slots, cfg.head_dim)
        return cls(*shape, weight.device, dtype or weight.dtype, rolling=cfg.window is not None)

    def prefill(self, tokens: int, device=None) -> CachedTokens:
        """The `tokens` tokens of a prompt, at positions 0 .. tokens-1: they attend over their own
        keys, as in training, and are kept for the steps after them."""
        positions = torch.arange(tokens, device=device or self.doc_start.device)
        return CachedTokens(self, positions, n_keys=None, prefill=True)

    def step(self, position: torch.Tensor, n_keys: int | None = None) -> CachedTokens:
        """One token at `position` (1,): it sees the first `n_keys` slots of a static cache where
        the caller knows that is position + 1, else every slot, masked."""
        return CachedTokens(self, position, n_keys, prefill=False)

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values (B, n_kv_head, slots, head_dim) of one layer."""
        return getattr(self, f"keys_{layer}"), getattr(self, f"values_{layer}")

    def write(self, layer: int, positions: torch.Tensor, keys, values) -> None:
        """Put keys and values (B, n_kv_head, T, head_dim) into the slots of `positions` (T,); a
        rolling cache keeps the last `slots` of them."""
        cached_keys, cached_values = self.layer(layer)
        kept = min(keys.size(2), self.slots)
        slots = positions[-kept:] % self.slots if self.rolling else positions
        cached_keys.index_copy_(2, slots, keys[:, :, -kept:])
        cached_values.index_copy_(2, slots, values[:, :, -kept:])

    def slot_positions(self, position: torch.Tensor) -> torch.Tensor:
        """(slots,) the position whose keys each slot holds once `position` (1,) is written: the
        slot's own index in a static cache; in a rolling one the latest position it took, negative
        if none yet."""
        slots = torch.arange(self.slots, device=position.device)
        return position - (position - slots) % self.slots if self.rolling else slots


class CachedTokens:
    """What one forward pass reads and writes of a KVCache (the model's `kv_cache`): the tokens'
    positions, the keys and values they attend over, and which of those each may see."""

    def __init__(self, cache: KVCache, positions: torch.Tensor, n_keys: int | None, prefill: bool):
        self.cache = cache
        self.positions = positions  # (T,)
        self.n_keys = n_keys
        self.prefill = prefill

    def update(self, layer: int, keys, values) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this pass's keys and values (B, n_kv_head, T, d) into the cache; return what the
        queries attend over: a prefill its own keys, a step the cache's slots (the first n_keys)."""
        self.cache.write(layer, self.positions, keys, values)
        if self.prefill:
            return keys, values
        cached_keys, cached_values = self.cache.layer(layer)
        if self.n_keys is not None and not self.cache.rolling:  # a view: no copy
            return cached_keys[:, :, : self.n_keys], cached_values[:, :, : self.n_keys]
        return cached_keys, cached_values

    def mask(self, idx: torch.Tensor, cfg) -> torch.Tensor | LocalSpan | None:
        """For the model's config `cfg`: None where each token sees every key it is handed (a
        prefill's causal attention; a step over the first n_keys slots), a LocalSpan for a prefill
        with a window or documents, else a boolean mask over the slots (T, slots) or, with
        documents, (B, 1, T, slots)."""
        starts = self.document_starts(idx, cfg.doc_token) if cfg.doc_mask else None
        if self.prefill:
            if cfg.window is None and starts is None:
                return None
            from model.local_attention import LocalSpan

            return LocalSpan(cfg.window, starts)
        rolling = self.cache.rolling
        if self.n_keys is not None and not rolling and starts is None:
            return None  # its query sees the first n_keys slots, every one
        key_pos = self.cache.slot_positions(self.positions)
        if self.n_keys is not None and not rolling:
            key_pos = key_pos[: self.n_keys]
        # slots filled, at or before the query, within the window
        allowed = (key_pos <= self.positions[:, None]) & (key_pos >= 0)
        if cfg.window is not None:
            allowed &= key_pos > self.positions[:, None] - cfg.window
        if starts is not None:  # and in the row's current document
            allowed = (allowed & (key_pos >= starts[:, :, None])).unsqueeze(1)
        return allowed

    def document_starts(self, idx: torch.Tensor, doc_token: int) -> torch.Tensor:
        """Where each token's document begins (B, T), continued from the cache's last step and kept
        in it for the next."""
        from model.local_attention import document_starts

        previous = None if self.prefill else self.cache.doc_start
        starts = document_starts(idx, doc_token, self.positions, previous)
        self.cache.doc_start.copy_(starts[:, -1])
        return starts
