"""A GPT's weights per head, processed as TransformerLens processes a model by default, for reading
circuits from the weights alone (interp/circuits.py): our circuits are its circuits only on the same
weights.

- each norm's scale is folded into what reads from it (norm1's into W_Q, W_K, W_V; the final norm's
  into W_U);
- with LayerNorm, what reads from it and what writes to the residual stream (W_E, W_pos, W_O) are
  centred over d_model, since LayerNorm removes that direction before anything reads it; RMSNorm
  keeps both;
- W_U is centred over the vocabulary (a logit added to every token changes no probability).
Biases are left out: the circuits are the weights' bilinear maps, as in Elhage et al. (2021). Shapes
follow TransformerLens: W_Q, W_K, W_V (n_layer, n_head, C, d), W_O (n_layer, n_head, d, C), W_E
(vocab, C), W_pos (block_size, C) or None, W_U (C, vocab); with grouped-query attention each query
head gets its group's W_K and W_V, so every table has one row per query head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from model import GPT


@dataclass
class HeadWeights:
    W_Q: torch.Tensor  # (L, H, C, d)
    W_K: torch.Tensor  # (L, H, C, d), expanded over a GQA group
    W_V: torch.Tensor  # (L, H, C, d), expanded over a GQA group
    W_O: torch.Tensor  # (L, H, d, C)
    W_E: torch.Tensor  # (vocab, C)
    W_pos: Optional[torch.Tensor]  # (block_size, C); None with rotary positions
    W_U: torch.Tensor  # (C, vocab)
    layernorm: bool  # LayerNorm (weights centred) or RMSNorm

    @property
    def n_layer(self) -> int:
        return self.W_Q.size(0)

    @property
    def n_head(self) -> int:
        return self.W_Q.size(1)


def _centred(W: torch.Tensor, dim: int, centre: bool) -> torch.Tensor:
    return W - W.mean(dim=dim, keepdim=True) if centre else W


def _attention(model: GPT, layer: int, dtype: torch.dtype, layernorm: bool):
    """One layer's W_Q, W_K, W_V (H, C, d) with norm1's scale folded in, and W_O (H, d, C)."""
    cfg = model.config
    block = model.blocks[layer]
    H = cfg.n_head
    Hk = cfg.kv_heads
    d = cfg.head_dim
    # (H d + 2 Hk d, C): rows are outputs
    weight = block.attn.W_QKV.weight.detach().to("cpu", dtype)
    # (C,): folded into every row's reading of x
    scale = block.norm1.weight.detach().to("cpu", dtype)
    W_q, W_k, W_v = weight.split([H * d, Hk * d, Hk * d])
    per_head = []
    for W, heads in ((W_q, H), (W_k, Hk), (W_v, Hk)):
        W = (W.view(heads, d, -1) * scale).transpose(1, 2)  # (heads, C, d)
        # a GQA group's
        per_head.append(_centred(W, 1, layernorm).repeat_interleave(H // heads, dim=0))
    # (H, d, C)
    W_O = block.attn.W_O.weight.detach().to("cpu", dtype).view(-1, H, d).permute(1, 2, 0)
    return (*per_head, _centred(W_O, 2, layernorm))


@torch.no_grad()
def head_weights(model: GPT, dtype: torch.dtype = torch.float64) -> HeadWeights:
    """The model's weights, processed as TransformerLens processes them by default (see the module's
    doc), on the CPU in `dtype` (float64: the scores are sums of many products, and the weights are
    small)."""
    layernorm = isinstance(model.norm_f, torch.nn.LayerNorm)
    layers = [_attention(model, layer, dtype, layernorm) for layer in range(model.config.n_layer)]
    W_Q, W_K, W_V, W_O = (torch.stack(parts) for parts in zip(*layers))
    W_E = _centred(model.token_emb.weight.detach().to("cpu", dtype), 1, layernorm)
    W_pos = None
    if model.pos_emb is not None:
        W_pos = _centred(model.pos_emb.weight.detach().to("cpu", dtype), 1, layernorm)
    final = model.norm_f.weight.detach().to("cpu", dtype)
    W_U = model.lm_head.weight.detach().to("cpu", dtype).T * final[:, None]  # (C, vocab)
    # read from a LayerNorm; then over the vocabulary
    W_U = _centred(_centred(W_U, 0, layernorm), 1, True)
    return HeadWeights(W_Q, W_K, W_V, W_O, W_E, W_pos, W_U, layernorm)
