"""The compiled decoding step's matrix products and attention, written as the loops inductor fuses
(sampling/compiled.py applies them to the exported step before AOTInductor compiles it).

A step is a few rows: the batch, one token each. ATen's matrix product for a few rows (MKL's sgemm
on an AMD EPYC) reads the weights at a quarter of the memory's speed, and SDPA's flash kernel for
one query spends more on its blocks than on the keys (BENCHMARKS.md, "Several samples at once"). As
sums of products, inductor compiles both into its own vectorised loops: a product's rows share each
load of a weight row (one accumulator per row), and attention is fused with the ops around it.
"""

from __future__ import annotations

import math

import torch

aten = torch.ops.aten

# rows a matrix product is written as sums for, each with its accumulator in a vector register
# (AVX2 has 16 of them); measured at 8 (BENCHMARKS.md), more go to ATen
MOST_ROWS = 8


def few_rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """F.linear for a few rows: each output a sum of products, every row's sum in the same loop
    over a weight row, so the weights are read once for all rows."""
    rows = x.reshape(-1, x.size(-1))
    if rows.size(0) > MOST_ROWS:
        return NotImplemented  # ATen's product
    # a row each: the input's users, so inductor keeps it in a buffer (`OPTIONS`)
    y = torch.stack([(weight * rows[i]).sum(-1) for i in range(rows.size(0))])
    y = y if bias is None else y + bias
    return y.view(*x.shape[:-1], weight.size(0))


def one_query_attention(
    q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """F.scaled_dot_product_attention for one query (B, H, 1, d) over keys and values
    (B, H_kv, S, d), `attn_mask` boolean or None; written out as sums, with no copy of the keys
    for grouped-query attention."""
    boolean = attn_mask is None or attn_mask.dtype == torch.bool
    if q.size(-2) != 1 or dropout_p or is_causal or not boolean:
        return NotImplemented  # ATen's attention
    B, H, _, d = q.shape
    H_kv = k.size(1)
    # each key/value head's group of query heads: (B, H_kv, group, 1, d) against (B, H_kv, 1, S, d)
    q = q.view(B, H_kv, H // H_kv, 1, d)
    k, v = k.unsqueeze(2), v.unsqueeze(2)
    scale = 1 / math.sqrt(d) if scale is None else scale
    # in float32 at least, as SDPA computes them
    scores = (q * k).sum(-1, dtype=torch.promote_types(q.dtype, torch.float32)) * scale
    if attn_mask is not None:  # (T, S) or (B, 1, T, S), T = 1
        mask = attn_mask.view(-1, 1, 1, attn_mask.size(-1)) if attn_mask.dim() == 4 else attn_mask
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).to(v.dtype)  # (B, H_kv, g, S)
    y = (weights.unsqueeze(-1) * v).sum(-2)  # (B, H_kv, g, d)
    return y.view(B, H, 1, d)


# inductor keeps a value read by several ops in a buffer rather than recompute it in each (a layer
# norm would be recomputed for every weight row)
OPTIONS = {"realize_reads_threshold": 0}


def fused(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """The exported step with its matrix products and attention as sums."""
    table = {
        aten.linear.default: few_rows_linear,
        aten.scaled_dot_product_attention.default: one_query_attention,
    }
    return program.run_decompositions(table)
