"""A decoder-only transformer (GPT), read top to bottom as nanoGPT's model.py.

tokens -> token embedding (+ learned positions) -> n_layer x [pre-norm causal multi-head self-attention,
pre-norm MLP, each added to the residual stream] -> final norm -> LM head (tied to the token embedding).

Notable:
- Attention runs through `F.scaled_dot_product_attention` (flash kernels); a hook on a head's pattern switches
  that layer to `attend_explicitly`, which writes the weights down (heads.py, `GPT.attention_weights`).
- Every option of `GPTConfig` (rotary, RMSNorm, QK-norm, GQA, windows, documents, ...) is off in the GPT-2
  defaults; `attention_inputs` turns the ones that touch attention into the rotary angles and the mask.
- `self.hook_*` lines are hook points (model/hooks.py): identities unless `hooked` sets them; skip them.
- `kv_cache` (model/kv_cache.py, docs/sampling.md) and `activation_checkpointing` (docs/training.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from model.attention import LocalSpan, attend_locally, attention_span, document_starts
from model.config import GPTConfig
from model.hooks import HookPoint, run_with_cache, speed_up_hook_points

if TYPE_CHECKING:  # generation's cache: a training run never makes one
    from model.kv_cache import KVCache


def make_norm(cfg: GPTConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.n_embd, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.n_embd, eps=cfg.norm_eps or 1e-5, bias=cfg.bias)


class Dropout(nn.Dropout):
    """nn.Dropout that skips nn.Module's call machinery where it is the identity (evaluation, or p = 0): 3% of
    an eager decoding step, which makes 2 n_layer + 1 such calls (BENCHMARKS.md, "Fast defaults")."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return super().__call__(x) if self.training and self.p > 0 else x


def rotary_tables(block_size: int, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * frequency, each (block_size, head_dim // 2)."""
    return rotary_angles(torch.arange(block_size), head_dim, base)


def rotary_angles(positions: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * frequency for the given positions, each (len(positions), head_dim // 2), in
    float64 rounded to float32 (the same values the tables hold)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim
    angles = positions.to(torch.float64)[:, None] * (1.0 / (base**exponents))
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+d/2}) of x (B, H, T, d) by the angles of their positions."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)


def causal_mask(
    query_pos: torch.Tensor, n_keys: int, window: Optional[int], key_pos: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """Boolean (n_queries, n_keys) mask, True where attention is allowed.

    Keys sit at positions 0 .. n_keys - 1 (or `key_pos`: the positions a rolling cache's slots hold, negative
    for a slot not written yet) and the queries at `query_pos`: a query at position p may attend to the keys
    at positions 0 .. p (and, with a window, not further back than window - 1 tokens). With a KV cache, the
    slots past the last query are empty or stale, and this mask hides them.
    """
    q_pos = query_pos[:, None]
    k_pos = (torch.arange(n_keys, device=query_pos.device) if key_pos is None else key_pos)[None, :]
    allowed = (k_pos <= q_pos) & (k_pos >= 0)
    if window is not None:
        allowed &= k_pos > q_pos - window
    return allowed


@dataclass(frozen=True)
class FirstSlots:
    """The mask of a one-token decoding step over a static cache (GPT.forward's `n_keys`): its query sees the
    cache's first `n` slots, every one, so attention takes them unmasked. A boolean mask cost an eager step
    35 us a layer (SDPA converts it to floats in each one; BENCHMARKS.md, "Fast defaults")."""

    n: int

    def dense(self, T: int, device: torch.device) -> torch.Tensor:
        """The same as a boolean mask (T, n): all True."""
        return torch.ones(T, self.n, dtype=torch.bool, device=device)


Mask = Optional[torch.Tensor | LocalSpan | FirstSlots]
Rotary = tuple[torch.Tensor, torch.Tensor]  # cos and sin of the positions' angles


def attend(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: Mask,
    dropout: float,
) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) + mask) V through F.scaled_dot_product_attention, which picks a flash kernel.

    `mask` is None for plain causal attention of T queries over the same T keys (training), a `LocalSpan`
    for a sliding window or documents over the same T keys (model/attention.py's blocks), `FirstSlots` for a
    decoding step that sees every key it is handed (no mask), else a boolean (T, n_keys) or (B, 1, T, n_keys)
    mask from `causal_mask` (the slots of a KV cache). Keys and values may have fewer heads than the queries
    (grouped-query attention): with SDPA's `enable_gqa` each serves its group of query heads, uncopied.

    On a CPU, bf16 attention runs in fp32 outside autocast: PyTorch's CPU flash kernel is several times
    slower in bf16 (BENCHMARKS.md, "Attention in fp32 under CPU autocast").
    """
    dtype = queries.dtype
    if dtype == torch.bfloat16 and queries.device.type == "cpu":
        with torch.autocast("cpu", enabled=False):
            return attend(queries.float(), keys.float(), values.float(), mask, dropout).to(dtype)
    if isinstance(mask, LocalSpan):
        return attend_locally(queries, keys, values, mask, dropout)
    gqa = keys.size(1) != queries.size(1)
    attn_mask = None if isinstance(mask, FirstSlots) else mask
    return F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=attn_mask, dropout_p=dropout, is_causal=mask is None, enable_gqa=gqa
    )


def attend_explicitly(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: Mask,
    dropout: float,
    hook_pattern: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
) -> torch.Tensor:
    """The same as `attend`, written out: the weights (B, H, T, n_keys) go through `hook_pattern`, which may
    read or replace them, before they weight the values."""
    T = queries.size(2)
    if mask is None:
        mask = causal_mask(torch.arange(T, device=queries.device), T, None)
    elif isinstance(mask, (LocalSpan, FirstSlots)):
        mask = mask.dense(T, queries.device)
    group = queries.size(1) // keys.size(1)  # query heads per key/value head
    keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = (queries @ keys.transpose(-2, -1)) / math.sqrt(queries.size(-1))
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    weights = weights.type_as(queries)
    if hook_pattern is not None:
        weights = hook_pattern(weights)
    return F.dropout(weights, dropout) @ values


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.kv_heads, cfg.head_dim
        self.W_QKV = nn.Linear(cfg.n_embd, (cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim, bias=cfg.bias)
        self.W_O = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.qk_norm = cfg.qk_norm
        self.attn_dropout = cfg.dropout
        self.resid_dropout = Dropout(cfg.dropout)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_pattern, self.hook_z = HookPoint(), HookPoint()

    def forward(
        self, x, rotary: Optional[Rotary], mask: Mask, kv_cache: Optional[KVCache] = None, positions=None
    ):
        B, T, C = x.shape
        H, H_kv, d = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = self.W_QKV(x).view(B, T, H + 2 * H_kv, d).split([H, H_kv, H_kv], dim=2)
        q = self.hook_q(q).transpose(1, 2)  # (B, H, T, d)
        k = self.hook_k(k).transpose(1, 2)  # (B, H_kv, T, d)
        v = self.hook_v(v).transpose(1, 2)
        if self.qk_norm:
            q, k = F.rms_norm(q, (d,)), F.rms_norm(k, (d,))
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        if kv_cache is not None:  # write this step's keys and values; attend over the slots the mask covers
            k, v = kv_cache.update(self.layer_idx, positions, k, v)
            if isinstance(mask, (torch.Tensor, FirstSlots)):  # a decoding step's n_keys: a view, no copy
                n = mask.n if isinstance(mask, FirstSlots) else mask.size(-1)
                k, v = k[:, :, :n], v[:, :, :n]
        dropout = self.attn_dropout if self.training else 0.0
        if self.hook_pattern.fns is None:  # the fast path: the weights are never written down
            y = attend(q, k, v, mask, dropout)
        else:
            y = attend_explicitly(q, k, v, mask, dropout, self.hook_pattern)
        y = self.hook_z(y.transpose(1, 2))  # (B, T, H, d): each head's output
        y = y.contiguous().view(B, T, C)  # concatenate the heads
        return self.resid_dropout(self.W_O(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        hidden = cfg.mlp_width
        self.activation = cfg.activation
        self.W_in = nn.Linear(cfg.n_embd, 2 * hidden if cfg.activation == "swiglu" else hidden, bias=cfg.bias)
        self.W_out = nn.Linear(hidden, cfg.n_embd, bias=cfg.bias)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.W_in(x)
        if self.activation == "gelu":
            h = F.gelu(h)
        elif self.activation == "gelu_tanh":  # GPT-2's approximation (transformers' gelu_new)
            h = F.gelu(h, approximate="tanh")
        elif self.activation == "relu2":
            h = F.relu(h).square()
        else:  # swiglu
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        return self.dropout(self.W_out(h))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, layer_idx: int):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.norm1 = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg, layer_idx)
        self.hook_attn_out = HookPoint()
        self.norm2 = make_norm(cfg) if cfg.mlp else None
        self.mlp = MLP(cfg) if cfg.mlp else None
        if cfg.mlp:
            self.hook_resid_mid, self.hook_mlp_out = HookPoint(), HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(
        self, x, rotary: Optional[Rotary], mask: Mask, kv_cache: Optional[KVCache] = None, positions=None
    ):
        x = self.hook_resid_pre(x)
        x = x + self.hook_attn_out(self.attn(self.norm1(x), rotary, mask, kv_cache, positions))
        if self.mlp is not None:
            x = self.hook_resid_mid(x)
            x = x + self.hook_mlp_out(self.mlp(self.norm2(x)))
        return self.hook_resid_post(x)


class GPT(nn.Module):
    activation_checkpointing = False  # train.activation_checkpointing: recompute blocks in backward

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.token_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd) if cfg.pos_emb == "learned" else None
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.norm_f = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.token_emb.weight
        if cfg.pos_emb == "rope":
            cos, sin = rotary_tables(cfg.block_size, cfg.head_dim, cfg.rope_base)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()
        speed_up_hook_points(self)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02), the residual projections (W_O, the MLP's output) scaled by
        1 / sqrt(2 n_layer), or zeroed."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            for proj in (block.attn.W_O, block.mlp.W_out if block.mlp is not None else None):
                if proj is None:
                    continue
                if self.config.zero_init_proj:
                    nn.init.zeros_(proj.weight)
                else:
                    nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; by default without the position embedding (and the token embedding
        when the LM head does not share it), as nanoGPT reports it."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            if self.pos_emb is not None:
                n -= self.pos_emb.weight.numel()
            if not self.config.tie_embeddings:
                n -= self.token_emb.weight.numel()
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward) as nanoGPT and PaLM (appendix B) count them:
        6 per weight used in a matrix product (4 for a frozen one, which gets no gradient: LoRA's base), plus
        12 * n_layer * n_embd * (attended span) for Q K^T and weights @ V: the keys per query that scores are
        computed for, masked ones included (all seq_len of them for causal attention, about 1.5 x window with
        a window: `attention_span`)."""
        cfg = self.config
        span = attention_span(seq_len, cfg.window)
        lookups = {id(self.pos_emb.weight) if self.pos_emb is not None else None}
        if not cfg.tie_embeddings:
            lookups.add(id(self.token_emb.weight))
        frozen = sum(p.numel() for p in self.parameters() if not p.requires_grad and id(p) not in lookups)
        return 6 * self.num_params(non_embedding=True) - 2 * frozen + 12 * cfg.n_layer * cfg.n_embd * span

    def forward(
        self,
        idx: torch.Tensor,
        targets: Optional[torch.Tensor] = None,
        kv_cache: Optional[KVCache] = None,
        last_only: bool = False,
        input_pos: Optional[torch.Tensor] = None,
        n_keys: Optional[int] = None,
    ):
        """idx (B, T) token ids -> (logits (B, T, vocab), mean cross-entropy against targets or None).

        With `last_only` the logits are computed for the last position alone (generation). With a
        `kv_cache` the tokens sit at positions `input_pos` (T,) of the cached sequence (default 0 .. T-1: a
        prefill): their keys and values are written into their slots, and each token attends to the cached
        positions up to its own (a rolling cache's prefill attends over its own keys, then keeps the last
        `window`); `n_keys` limits that to the first n_keys slots of a static cache (a decoding step at
        position p: p + 1; the slots past it hold nothing it may see). Targets of -1 are ignored by the loss.
        """
        T = idx.size(1)
        if self.config.block_size < T and not self.config.unbounded_context:
            raise ValueError(f"sequence of {T} tokens is longer than block_size={self.config.block_size}")
        pos = torch.arange(T, device=idx.device) if input_pos is None else input_pos
        rotary, mask = self.attention_inputs(idx, pos, kv_cache, input_pos, n_keys)  # GPT-2: None, None
        x = self.token_emb(idx)
        if self.pos_emb is not None:
            x = x + self.pos_emb(pos)
        x = self.drop(x)
        for block in self.blocks:
            if self.activation_checkpointing and torch.is_grad_enabled():
                # keep x alone; backward runs the block again (non-reentrant: dropout draws the same masks)
                x = checkpoint(block, x, rotary, mask, kv_cache, pos, use_reentrant=False)
            else:
                x = block(x, rotary, mask, kv_cache, pos)
        logits = self.unembed(x[:, -1:] if last_only else x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def unembed(self, x: torch.Tensor) -> torch.Tensor:
        """The logits a residual stream (..., C) stands for: the final norm, the LM head and any soft cap (the
        logit lens applies them to any layer's residual)."""
        logits = self.lm_head(self.norm_f(x))
        cap = self.config.logit_softcap
        return cap * torch.tanh(logits / cap) if cap else logits

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """A forward pass that keeps every head's pattern (the explicit attention path): (logits (B, T,
        vocab), one (B, n_head, T, T) tensor of attention weights per layer; row q holds how query q
        distributes over the keys)."""
        names = [f"blocks.{layer}.attn.pattern" for layer in range(len(self.blocks))]
        logits, cache = run_with_cache(self, idx, names)
        return logits, [cache[name] for name in names]

    def attention_inputs(
        self,
        idx: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: Optional[KVCache] = None,
        input_pos: Optional[torch.Tensor] = None,
        n_keys: Optional[int] = None,
    ) -> tuple[Optional[Rotary], Mask]:
        """What attention needs besides the tokens: the rotary angles of `positions` (None with learned
        positions), and the mask: None for plain causal attention, a LocalSpan for a window or documents over
        the tokens' own keys (training, evaluation, a rolling cache's prefill), or a boolean mask over a
        cache's slots."""
        if kv_cache is not None and kv_cache.rolling and input_pos is not None and idx.size(1) > 1:
            raise ValueError("a rolling KV cache takes its prefill from position 0, then one token at a time")
        starts = self._document_starts(idx, positions, kv_cache, input_pos) if self.config.doc_mask else None
        return self._rotary(positions, input_pos), self._mask(positions, kv_cache, starts, n_keys)

    def _rotary(self, positions: torch.Tensor, input_pos: Optional[torch.Tensor]) -> Optional[Rotary]:
        if self.pos_emb is not None:
            return None
        cfg = self.config
        if cfg.unbounded_context and (input_pos is not None or positions.size(0) > cfg.block_size):
            cos, sin = rotary_angles(positions, cfg.head_dim, cfg.rope_base)  # may lie past the tables
            return cos.to(self.rope_cos.dtype), sin.to(self.rope_sin.dtype)
        return self.rope_cos[positions], self.rope_sin[positions]

    def _document_starts(
        self,
        idx: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: Optional[KVCache],
        input_pos: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """Where each token's document begins (B, T), kept in the cache for the next step."""
        previous = kv_cache.doc_start if kv_cache is not None and input_pos is not None else None
        starts = document_starts(idx, self.config.doc_token, positions, previous)
        if kv_cache is not None:
            kv_cache.doc_start.copy_(starts[:, -1])
        return starts

    def _mask(
        self,
        positions: torch.Tensor,
        kv_cache: Optional[KVCache],
        starts: Optional[torch.Tensor],
        n_keys: Optional[int] = None,
    ) -> Mask:
        window = self.config.window
        if kv_cache is None or (kv_cache.rolling and positions.size(0) > 1):
            return LocalSpan(window, starts) if window is not None or starts is not None else None
        if n_keys is not None and not kv_cache.rolling and window is None and starts is None:
            return FirstSlots(n_keys)  # one query at position n_keys - 1: it sees every slot up to its own
        key_pos = kv_cache.slot_positions(positions[-1:])
        if n_keys is not None and not kv_cache.rolling:
            key_pos = key_pos[:n_keys]
        mask = causal_mask(positions, key_pos.size(0), window, key_pos)
        if starts is not None:  # (B, 1, T, slots): the keys of each row's current document
            mask = (mask & (key_pos >= starts[:, :, None])).unsqueeze(1)
        return mask
