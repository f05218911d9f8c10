"""A key/value cache for generation: each layer's keys and values for the tokens seen so far.

Preallocated once for `max_len` positions (at most the model's block_size); `update` writes a layer's new
keys and values at the current position and returns every position up to and including them; `advance`
moves the position on once all layers have run.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(
        self,
        n_layer: int,
        batch_size: int,
        n_kv_head: int,
        max_len: int,
        head_dim: int,
        device: torch.device | str,
        dtype: torch.dtype,
    ):
        shape = (n_layer, batch_size, n_kv_head, max_len, head_dim)
        self.keys = torch.empty(shape, device=device, dtype=dtype)
        self.values = torch.empty(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.pos = 0

    @classmethod
    def for_model(cls, model: torch.nn.Module, batch_size: int, dtype: torch.dtype | None = None) -> KVCache:
        cfg = model.config
        weight = model.token_emb.weight
        return cls(
            cfg.n_layer,
            batch_size,
            cfg.kv_heads,
            cfg.block_size,
            cfg.head_dim,
            weight.device,
            dtype or weight.dtype,
        )

    def reset(self) -> None:
        self.pos = 0

    def update(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.pos + keys.size(2)
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; cannot append up to {end}")
        self.keys[layer, :, :, self.pos : end] = keys
        self.values[layer, :, :, self.pos : end] = values
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def advance(self, n: int) -> None:
        self.pos += n
