"""A static key/value cache for generation: each layer's keys and values, one slot per position.

Allocated once for `max_len` positions (the model's block_size) and never reallocated: `update` writes the
keys and values of the tokens at the given positions into their slots (in place, with `index_copy_`) and
returns the layer's whole cache; the attention mask (`model.gpt.causal_mask`) hides the slots past each
query. The shapes are the same at every decoding step, which is what lets `torch.compile` (and CUDA graphs)
take the step once and replay it. The cache keeps no position of its own: the caller says where the tokens go.
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
        # zeros rather than empty: masked slots get attention weight 0, but 0 * NaN would still be NaN
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len

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

    def update(
        self, layer: int, positions: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write keys and values (B, n_kv_head, T, head_dim) into the slots `positions` (T,) of `layer`;
        return that layer's keys and values for all max_len slots."""
        self.keys[layer].index_copy_(2, positions, keys)
        self.values[layer].index_copy_(2, positions, values)
        return self.keys[layer], self.values[layer]
