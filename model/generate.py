"""Autoregressive generation: sampling rules and the KV-cached decoding loop.

Context policy past `block_size`: the model never sees more than block_size tokens. When the window is
full, it slides forward by half a block: the last block_size // 2 tokens are encoded afresh (one prefill)
and decoding goes on one token per step. Every new token therefore sees between block_size // 2 and
block_size previous tokens. Re-encoding the last block_size tokens at every step (nanoGPT's crop) would give
each token a full context but cost a whole forward pass per token, which is what the cache exists to avoid.
`use_cache=False` follows the same windows with a full forward pass per token: it is the reference the
cached path is tested against, and the baseline bench.py measures the cache against.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Optional

import torch

from model.kv_cache import KVCache


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """Pick one token per row of logits (B, vocab) -> (B,). Temperature 0 is greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the tokens ranked above each one
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)  # the top token always survives
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    generator: Optional[torch.Generator] = None,
    use_cache: bool = True,
) -> Iterator[torch.Tensor]:
    """Continue idx (B, T) token ids, yielding each new column of tokens (B,) as soon as it is chosen."""
    block_size = model.config.block_size
    keep = max(1, block_size // 2)  # tokens kept when the window slides
    cache = KVCache.for_model(model, idx.size(0)) if use_cache else None
    window = idx[:, -block_size:]  # the tokens the model currently conditions on
    logits, _ = model(window, kv_cache=cache, last_only=True)
    for step in range(max_new_tokens):
        token = sample_next(logits[:, -1], temperature, top_k, top_p, generator)
        yield token
        if step == max_new_tokens - 1:
            return
        window = torch.cat([window, token[:, None]], dim=1)
        if window.size(1) > block_size:  # slide: re-encode the most recent tokens
            window = window[:, -keep:]
            if cache is not None:
                cache.reset()
                logits, _ = model(window, kv_cache=cache, last_only=True)
                continue
        if cache is not None:
            logits, _ = model(token[:, None], kv_cache=cache, last_only=True)
        else:
            logits, _ = model(window, last_only=True)
