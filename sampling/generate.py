"""Autoregressive generation: the sampling rules (`sample_next`), a prompt's prefill, the eager
decoding step, and the KV-cached loop (`generate`).

Past block_size the context slides forward by half a block (one prefill of the last block_size // 2
tokens), so every token sees between half a context and a whole one at one token's cost per step; a
model with a window and rotary positions (`unbounded_context`) never slides: its rolling cache goes
on past block_size. `use_cache=False` follows the same windows with a full forward pass per token:
the reference the cache is tested against. The step may be compiled (sampling/steps.py says when).
Sampling never waits for the device: reading the token is the step's one host sync, the caller's.
docs/sampling.md ("How decoding works") says why, and what the batch size and the thread count do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial
from typing import Optional

import torch

from common.threads import ThreadTuner
from sampling.kv_cache import KVCache, Step
from sampling.steps import building, decoder


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
        # mass of the tokens ranked above each one
        before = sorted_probs.cumsum(dim=-1) - sorted_probs
        # the top token always survives
        sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    # The exponential race: argmax of p / E with E ~ Exp(1) picks token i with probability p_i. It
    # is how torch.multinomial(probs, 1) draws (the same generator gives the same token), without
    # multinomial's check of the probabilities, which waits for the device on CUDA.
    race = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / race).argmax(dim=-1)


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
    compile: Optional[bool] = None,
    tuner: Optional[ThreadTuner] = None,
    step: Optional[tuple[KVCache, Step]] = None,
) -> Iterator[torch.Tensor]:
    """Continue idx (B, T) token ids, yielding each new column of tokens (B,) as soon as it is
    chosen.

    The tokens stay on the model's device. `step` is the KV cache and the decoding step into it, as
    the caller chose them (sample.py: sampling/steps.py's `decoder`); without it `compile` chooses:
    True compiles the step, False keeps it eager, None the default (`decoder` too).
    `tuner` picks the CPU's thread count (default: the cores other processes leave free, one beside
    a background build; a run's runtime gives one that keeps its train.threads).
    """
    B = idx.size(0)
    block_size = model.config.block_size
    endless = model.config.unbounded_context  # positions go on past block_size: no slide
    # endless: the whole prompt, prefilled
    n = idx.size(1) if endless else min(idx.size(1), block_size)
    # the tokens in context, a column (B,) each: appending is free
    context = list(idx[:, -n:].unbind(1))
    if not use_cache:
        yield from _recompute(model, context, max_new_tokens, temperature, top_k, top_p, generator)
        return
    if step is None:  # chosen here
        chosen = decoder(model, B, compile, max_new_tokens, eager_step)
    else:
        chosen = contextlib.nullcontext(step)
    with chosen as (cache, step):
        slot = torch.tensor([n], device=idx.device)  # where the next token goes in the cache
        # the cores other processes leave free; one beside a build (sampling/steps.py)
        if tuner is None:
            tuner = ThreadTuner.for_device(idx.device, enabled=not building(step), by_load=True)
        logits = prefill(model, idx[:, -n:], cache)
        for i in range(max_new_tokens):
            token = sample_next(logits, temperature, top_k, top_p, generator)
            yield token
            if i == max_new_tokens - 1:
                return
            # slid: encode the most recent tokens afresh
            if _append(context, token, block_size, endless):
                logits = prefill(model, torch.stack(context, 1), cache)
                slot.fill_(len(context))
            else:
                with tuner.timed(i):
                    logits = step(token, slot)
                slot += 1


def _recompute(model, context, max_new_tokens, temperature, top_k, top_p, generator) -> Iterator:
    """The reference: a full forward over the tokens in context for every new token, the same
    windows."""
    block_size = model.config.block_size
    endless = model.config.unbounded_context
    logits = prefill(model, torch.stack(context, 1), None)
    for i in range(max_new_tokens):
        token = sample_next(logits, temperature, top_k, top_p, generator)
        yield token
        if i == max_new_tokens - 1:
            return
        _append(context, token, block_size, endless)
        logits = prefill(model, torch.stack(context, 1), None)


def _append(
    context: list[torch.Tensor], token: torch.Tensor, block_size: int, endless: bool
) -> bool:
    """Put `token` after the tokens in context; past block_size (and not endless) keep only the most
    recent half of them. Returns whether the window slid."""
    context.append(token)
    if endless or len(context) <= block_size:
        return False
    del context[: len(context) - max(1, block_size // 2)]  # the tokens kept when the window slides
    return True


def prefill(model: torch.nn.Module, tokens: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
    """Logits (B, vocab) after tokens (B, T) at positions 0 .. T-1, kept in the cache if any."""
    kv_cache = cache.prefill(tokens.size(1)) if cache is not None else None
    logits, _ = model(tokens, kv_cache=kv_cache, last_only=True)
    return logits[:, -1]


def decode_step(
    model: torch.nn.Module, token: torch.Tensor, position: torch.Tensor, cache: KVCache
) -> torch.Tensor:
    """Logits (B, vocab) of the token after `token` (B,), which goes into cache slot `position`
    (1,), eagerly (sampling/compiled.py compiles the same step)."""
    cpu = position.device.type == "cpu"
    # the slots past the position hold nothing the token may see: a CPU reads the position for
    # free and hands attention the filled slots alone (a GPU would wait for it: there every slot)
    n_keys = int(position) + 1 if cpu and not cache.rolling else None
    onednn = torch.backends.mkldnn.enabled
    # oneDNN's gelu takes 50 us on 1,536 numbers inside a step, ATen's 2 (BENCHMARKS.md)
    torch.backends.mkldnn.enabled = onednn and not cpu
    try:
        # inference mode: 7-10% less than no_grad on an eager step's 200 small operators
        with torch.inference_mode(cpu):
            logits, _ = model(token[:, None], kv_cache=cache.step(position, n_keys))
            return logits[:, -1]
    finally:
        torch.backends.mkldnn.enabled = onednn


def eager_step(model: torch.nn.Module, cache: KVCache):
    """The eager decoding step for `model` and `cache`: (token (B,), position (1,)) -> logits."""
    return partial(decode_step, model, cache=cache)
