"""Attention that sees only part of the sequence (a sliding window, the token's own document) at a
cost that grows linearly with the sequence length.

`attend_locally` cuts the queries into blocks of `block` tokens; each block attends to its own keys
and those of the `reach` blocks before it under one fixed band mask, all blocks in one batched SDPA
call: T * (reach + 1) * block scores rather than T^2, and no T x T tensor. A dense T x T mask would
compute every score and hide most of them. docs/heads.md ("What the causal mask and a window cost")
explains it; BENCHMARKS.md ("Attention's cost against the sequence length") measures it and the
block sizes `block_layout` chose.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

# windows from this size are cut into blocks of half the window (see block_layout)
HALF_BLOCKS_FROM = 64
# shorter sequences, or windows over a quarter of T, take one dense mask (see block_layout)
BLOCKS_FROM = 256


@dataclass(frozen=True)
class LocalSpan:
    """Which keys each query of a (B, T) sequence at positions 0 .. T-1 sees, besides causality: the
    last `window` tokens (None: all), and only those of its own document (`starts` (B, T): where
    each token's document begins; None: one document)."""

    window: Optional[int]
    starts: Optional[torch.Tensor] = None
    masks: dict = field(default_factory=dict, compare=False, repr=False)  # see `additive`

    def additive(self, name: str, dtype: torch.dtype, allowed) -> torch.Tensor:
        """The mask `allowed()` (boolean) as an additive float mask in `dtype` (0 or -inf), made
        once for all the layers of a forward pass: handed a boolean, SDPA would make its own in
        every layer, and every layer would keep one for backward."""
        if (name, dtype) not in self.masks:
            mask = allowed()
            self.masks[name, dtype] = torch.zeros(
                mask.shape, dtype=dtype, device=mask.device
            ).masked_fill_(~mask, float("-inf"))
        return self.masks[name, dtype]

    def dense(self, T: int, device: torch.device) -> torch.Tensor:
        """The same as a boolean mask, True where attention is allowed: (T, T), or with documents
        (B, 1, T, T)."""
        return band_mask(T, T, 0, self.window, device, self.starts, self.starts)


def document_starts(
    idx: torch.Tensor,
    doc_token: int,
    positions: torch.Tensor,
    previous: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """(B, T) positions where the document of each token of idx (B, T) begins: at the last
    `doc_token` (<|endoftext|>) at or before it, which so belongs to the document it opens (as a BOS
    token: a sampled document starts from it alone); before any, at `previous` (B,) (a KV cache's)
    or 0."""
    marks = torch.where(idx == doc_token, positions, torch.zeros_like(idx))
    if previous is not None:
        marks = torch.maximum(marks, previous[:, None])
    return marks.cummax(dim=1).values


def block_layout(T: int, window: Optional[int]) -> tuple[int, int]:
    """(block, reach): queries in blocks of `block` tokens, each seeing its own block and `reach`
    before it.

    No window, or one that covers T: a single block (reach 0). The same, under a dense T x T mask,
    for T below BLOCKS_FROM or a window over T / 4: there the blocks' two calls cost more than the
    scores they save. Windows of HALF_BLOCKS_FROM or more: blocks of half the window, reach 2 (they
    compute 1.5 w scores per query, not 2 w); smaller ones: blocks of the window, reach 1 (small
    blocks leave SDPA's kernels too little work per call). The measurements behind each choice:
    BENCHMARKS.md, "Attention's cost against the sequence length"."""
    if window is None or T < BLOCKS_FROM or window > T // 4:
        return T, 0
    block = -(-window // 2) if window >= HALF_BLOCKS_FROM else window
    return block, max(1, -(-(window - 1) // block))


def attention_span(T: int, window: Optional[int]) -> float:
    """Keys per query that `attend_locally` computes scores for (masked ones included), averaged
    over a row of T queries: T without a window (causal masking not discounted, as FLOP counts do),
    else every block's (reach + 1) * block keys, the padding included, plus the reach * block keys
    of each row's first tokens."""
    block, reach = block_layout(T, window)
    if reach == 0:
        return float(T)
    n = -(-T // block)
    head = min(T, reach * block)
    return (n * block * (reach + 1) * block + head * head) / T


def band_mask(
    n_queries: int,
    n_keys: int,
    offset: int,
    window: Optional[int],
    device: torch.device,
    query_starts: Optional[torch.Tensor] = None,
    key_starts: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Boolean mask, True where query i (at position offset + i of the keys' frame) may see key j: j
    <= offset + i, within the window; with document starts (..., n_queries) and (..., n_keys) also
    the same document: then (..., 1, n_queries, n_keys)."""
    back = (
        offset
        + torch.arange(n_queries, device=device)[:, None]
        - torch.arange(n_keys, device=device)
    )
    allowed = back >= 0
    if window is not None:
        allowed &= back < window
    if query_starts is not None:
        allowed = allowed & (query_starts[..., :, None] == key_starts[..., None, :])
        allowed = allowed.unsqueeze(-3)
    return allowed


def _token_major(x: torch.Tensor, length: int) -> torch.Tensor:
    """(B, H, T, d) -> (B, length, H, d), padded with zeros past T (a view where no padding is
    needed)."""
    x = x.transpose(1, 2)
    return F.pad(x, (0, 0, 0, 0, 0, length - x.size(1))) if length > x.size(1) else x


def _windows(x: torch.Tensor, block: int, width: int) -> torch.Tensor:
    """x (B, length, H, d) -> (B * length / block - reach, H, width, d): for each block of the
    flattened batch from the reach-th on, the `width` tokens that end with it. A view of x's rows
    back to back (the windows overlap; unfold's backward adds their gradients up), so no key is
    copied (an `as_strided` view took the same time and twice the memory: its backward scatters into
    the overlaps)."""
    flat = x.reshape(-1, x.size(2), x.size(3))
    return flat.unfold(0, width, block).permute(0, 1, 3, 2)


def _block_documents(band: torch.Tensor, starts: torch.Tensor, block: int, reach: int, length: int):
    """(blocks, 1, block, width): the band mask of every block of the flattened batch from the
    reach-th on, and the same document start for query and key (padding in a document of its
    own)."""
    padded = F.pad(starts, (0, length - starts.size(1)), value=-1).reshape(-1)
    same = (
        padded.view(-1, block)[reach:, :, None] == padded.unfold(0, band.size(1), block)[:, None, :]
    )
    return (band & same).unsqueeze(1)


def _sdpa(q, k, v, mask, dropout: float, causal: bool = False) -> torch.Tensor:
    """SDPA with grouped-query heads. With dropout it takes the math path (the CPU flash kernel has
    none): slower, and the block-sized scores are kept for backward. On CUDA these masked calls run
    the memory-efficient kernel (flash takes no mask); FlexAttention would skip the masked tiles,
    but its backward does not run on a CPU in torch 2.13, so it could not be tested here."""
    gqa = k.size(1) != q.size(1)
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        dropout_p=dropout,
        is_causal=causal and mask is None,
        enable_gqa=gqa,
    )


def attend_locally(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, span: LocalSpan, dropout: float
) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) + mask) V for the mask `span` describes, queries (B, H, T, d) at
    positions 0 .. T-1 over their own keys and values (B, H_kv, T, d); (B, H, T, d) out."""
    B, H, T, d = queries.shape
    window = span.window
    starts = span.starts
    block, reach = block_layout(T, window)
    n = -(-T // block)
    length = n * block
    width = (reach + 1) * block
    # the first `reach` blocks of each row would reach before its start, into the previous row (the
    # batch is one long sequence of blocks): those `head` tokens are answered by a call of their
    # own, written over
    head = min(T, reach * block) if reach else T
    q, k, v = (_token_major(x, length) for x in (queries, keys, values))
    mask = None  # causal alone, where the window does not bind on the first `head` tokens
    if starts is not None or (window is not None and head > window):
        heads = starts[:, :head] if starts is not None else None
        mask = span.additive(
            "head", q.dtype, lambda: band_mask(head, head, 0, window, q.device, heads, heads)
        )
    first = _sdpa(*(x[:, :head].transpose(1, 2) for x in (q, k, v)), mask, dropout, causal=True)
    if head == T:
        return first
    q_blocks = q.reshape(B * n, block, H, d)[reach:].transpose(1, 2)
    # padding queries (past T), and the queries of blocks written over, see at least themselves: a
    # row of scores all masked would put NaN into the keys' gradients
    mask = band_mask(block, width, reach * block, window, queries.device)
    if starts is not None:
        mask = span.additive(
            "blocks", q.dtype, lambda: _block_documents(mask, starts, block, reach, length)
        )
    out = _sdpa(q_blocks, _windows(k, block, width), _windows(v, block, width), mask, dropout)
    y = torch.cat([first[0].transpose(0, 1), out.transpose(1, 2).reshape(-1, H, d)]).view(
        B, length, H, d
    )
    if B > 1:
        y[1:, :head] = first[1:].transpose(1, 2)
    return y[:, :T].transpose(1, 2)
