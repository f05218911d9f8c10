"""A decoder-only transformer (GPT), read top to bottom as nanoGPT's model.py.

tokens -> token embedding (+ learned positions) -> n_layer blocks of [attention, MLP], each added to
the residual stream -> final norm -> LM head (tied to the token embedding) -> logits.

GPT-2's defaults; every other option of GPTConfig (rotary, RMSNorm, QK-norm, grouped-query
attention, windows, documents, ...) is off until a config turns it on. `self.hook_*` lines are hook
points (model/hooks.py): identities unless a hook is set; skip them when reading.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from model.config import GPTConfig
from model.hooks import HookPoint, run_with_cache, speed_up_hook_points


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx  # which of a KV cache's layers is this one's
        self.n_head = cfg.n_head
        self.n_kv_head = cfg.kv_heads  # grouped-query attention: fewer key/value heads, shared
        self.head_dim = cfg.head_dim
        # the queries, keys and values of every head in one matrix product
        qkv_width = (cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim
        self.W_QKV = nn.Linear(cfg.n_embd, qkv_width, bias=cfg.bias)
        self.W_O = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.qk_norm = cfg.qk_norm
        self.dropout = cfg.dropout
        self.resid_dropout = Dropout(cfg.dropout)
        self.hook_q = HookPoint()
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()

    def forward(self, x, rotary=None, mask=None, kv_cache=None):
        B, T, C = x.shape  # batch, tokens, n_embd
        H, H_kv, d = self.n_head, self.n_kv_head, self.head_dim
        q, k, v = self.W_QKV(x).view(B, T, H + 2 * H_kv, d).split([H, H_kv, H_kv], dim=2)
        q = self.hook_q(q).transpose(1, 2)  # (B, T, H, d) -> (B, H, T, d)
        k = self.hook_k(k).transpose(1, 2)  # (B, H_kv, T, d)
        v = self.hook_v(v).transpose(1, 2)  # (B, H_kv, T, d)
        if self.qk_norm:
            q, k = F.rms_norm(q, (d,)), F.rms_norm(k, (d,))
        if rotary is not None:  # rotary positions: q and k turned by their positions' angles
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        if kv_cache is not None:  # generation: the keys and values cached so far join this step's
            k, v = kv_cache.update(self.layer_idx, k, v)  # (B, H_kv, S, d): S keys in all
        dropout = self.dropout if self.training else 0.0
        if self.hook_pattern.fns is None:  # nothing reads the weights: a kernel computes the same
            y = attend_fast(q, k, v, mask, dropout)  # (B, H, T, d)
        else:
            y = attend(q, k, v, mask, dropout, self.hook_pattern)
        y = self.hook_z(y.transpose(1, 2))  # (B, T, H, d): each head's output
        y = y.contiguous().view(B, T, C)  # the heads side by side again
        return self.resid_dropout(self.W_O(y))


def attend(q, k, v, mask=None, dropout=0.0, hook_pattern=None):
    """softmax(q k^T / sqrt(d) + mask) v: each query's weighted mix of the values, for q
    (B, H, T, d) over k, v (B, H_kv, S, d) (grouped-query attention: each key/value head serves
    H / H_kv query heads).

    `mask` None: causal, the T queries being the last T of the S keys; a boolean tensor, True where
    a query may look, (T, S) or (B, 1, T, S); or a LocalSpan (a window, documents). `hook_pattern`
    may read or replace the weights (B, H, T, S). `attend_fast` computes the same without them.
    """
    T, S = q.size(2), k.size(2)
    if mask is None:  # causal: the queries are the last T keys
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
    elif not isinstance(mask, torch.Tensor):  # a LocalSpan
        mask = mask.dense(T, q.device)
    group = q.size(1) // k.size(1)  # query heads per key/value head
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, H, T, S)
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    weights = weights.type_as(q)
    if hook_pattern is not None:
        weights = hook_pattern(weights)
    return F.dropout(weights, dropout) @ v


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        hidden = cfg.mlp_width
        self.activation = cfg.activation
        # SwiGLU's first matrix holds its gate and its up projection side by side
        in_width = 2 * hidden if cfg.activation == "swiglu" else hidden
        self.W_in = nn.Linear(cfg.n_embd, in_width, bias=cfg.bias)
        self.W_out = nn.Linear(hidden, cfg.n_embd, bias=cfg.bias)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.W_in(x)  # (B, T, hidden)
        if self.activation == "gelu":
            h = F.gelu(h)
        elif self.activation == "gelu_tanh":  # GPT-2's approximation (transformers' gelu_new)
            h = F.gelu(h, approximate="tanh")
        elif self.activation == "relu2":
            h = ReLUSquared.apply(h)  # F.relu(h).square(), its backward in fewer passes
        else:  # swiglu
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        return self.dropout(self.W_out(h))  # (B, T, C)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, layer_idx: int):
        super().__init__()
        self.hook_resid_pre = HookPoint()
        self.norm1 = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg, layer_idx)
        self.hook_attn_out = HookPoint()
        # mlp=false: an attention-only transformer (the circuits papers' toy models)
        self.norm2 = make_norm(cfg) if cfg.mlp else None
        self.mlp = MLP(cfg) if cfg.mlp else None
        if cfg.mlp:
            self.hook_resid_mid = HookPoint()
            self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, x, rotary=None, mask=None, kv_cache=None):
        x = self.hook_resid_pre(x)
        x = x + self.hook_attn_out(self.attn(self.norm1(x), rotary, mask, kv_cache))
        if self.mlp is not None:
            x = self.hook_resid_mid(x)
            x = x + self.hook_mlp_out(self.mlp(self.norm2(x)))
        return self.hook_resid_post(x)


class GPT(nn.Module):
    # train.activation_checkpointing: keep each block's input alone, recompute the rest in backward
    activation_checkpointing = False

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.token_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = None  # rotary positions turn q and k instead (`rotary`)
        if cfg.pos_emb == "learned":
            self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.norm_f = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.token_emb.weight
        if cfg.pos_emb == "rope":
            cos, sin = rotary_angles(torch.arange(cfg.block_size), cfg.head_dim, cfg.rope_base)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()
        speed_up_hook_points(self)

    def forward(self, idx, targets=None, kv_cache=None, last_only=False):
        """idx (B, T) token ids -> (logits (B, T, vocab), mean cross-entropy or None).

        Targets of -1 are left out of the loss. With `last_only` the logits are the last position's
        alone (generation). With a KV cache (sampling/kv_cache.py's `KVCache.at`), the tokens sit at
        the positions it gives, and attend to what it holds besides themselves.
        """
        T = idx.size(1)
        if self.config.block_size < T and not self.config.unbounded_context:
            raise ValueError(
                f"sequence of {T} tokens is longer than block_size={self.config.block_size}"
            )
        pos = kv_cache.positions if kv_cache is not None else torch.arange(T, device=idx.device)
        x = self.token_emb(idx)  # (B, T, C)
        if self.pos_emb is not None:
            x = x + self.pos_emb(pos)
        x = self.drop(x)
        rotary = self.rotary(pos, beyond_tables=kv_cache is not None or self.config.block_size < T)
        mask = self.attention_mask(idx, pos, kv_cache)  # None: causal, as GPT-2's
        for block in self.blocks:
            if self.activation_checkpointing and torch.is_grad_enabled():
                # non-reentrant: the recomputed block draws the same dropout masks
                x = checkpoint(block, x, rotary, mask, kv_cache, use_reentrant=False)
            else:
                x = block(x, rotary, mask, kv_cache)
        logits = self.unembed(x[:, -1:] if last_only else x)  # (B, T, vocab)
        loss = None
        if targets is not None:
            flat = logits.view(-1, logits.size(-1))
            loss = F.cross_entropy(flat, targets.view(-1), ignore_index=-1)
        return logits, loss

    def unembed(self, x: torch.Tensor) -> torch.Tensor:
        """The logits a residual stream (..., C) stands for: the final norm, the LM head and any
        soft cap (the logit lens applies them to any layer's residual)."""
        logits = self.lm_head(self.norm_f(x))
        cap = self.config.logit_softcap
        return cap * torch.tanh(logits / cap) if cap else logits

    def rotary(self, pos: torch.Tensor, beyond_tables: bool):
        """cos and sin of the positions' angles, each (T, head_dim / 2); None for learned
        positions."""
        if self.pos_emb is not None:
            return None
        cfg = self.config
        if cfg.unbounded_context and beyond_tables:  # positions may lie past the tables
            cos, sin = rotary_angles(pos, cfg.head_dim, cfg.rope_base)
            return cos.to(self.rope_cos.dtype), sin.to(self.rope_sin.dtype)
        return self.rope_cos[pos], self.rope_sin[pos]

    def attention_mask(self, idx, pos, kv_cache):
        """None for plain causal attention; a LocalSpan for a window or documents; with a KV cache,
        the cache's mask over what it holds."""
        cfg = self.config
        if kv_cache is not None:  # which of its slots each token may see is the cache's to say
            return kv_cache.mask(idx, cfg)
        if cfg.window is None and not cfg.doc_mask:
            return None
        from model.local_attention import LocalSpan, document_starts  # windows and documents only

        starts = document_starts(idx, cfg.doc_token, pos) if cfg.doc_mask else None
        return LocalSpan(cfg.window, starts)

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(logits (B, T, vocab), each layer's attention weights (B, n_head, T, T)): row q holds how
        query q spreads over the keys."""
        names = [f"blocks.{layer}.attn.pattern" for layer in range(len(self.blocks))]
        logits, cache = run_with_cache(self, idx, names)
        return logits, [cache[name] for name in names]

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2's initialisation: N(0, 0.02), the residual projections (W_O, the MLP's output)
        scaled by 1 / sqrt(2 n_layer), or zeroed."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for block in self.blocks:
            projections = [block.attn.W_O] + ([block.mlp.W_out] if block.mlp is not None else [])
            for proj in projections:
                if self.config.zero_init_proj:
                    nn.init.zeros_(proj.weight)
                else:
                    nn.init.normal_(proj.weight, mean=0.0, std=std)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; by default without the position embedding (and the token embedding
        when the LM head does not share it), as nanoGPT reports it."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and self.pos_emb is not None:
            n -= self.pos_emb.weight.numel()
        if non_embedding and not self.config.tie_embeddings:
            n -= self.token_emb.weight.numel()
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward) as nanoGPT and PaLM (appendix B) count
        them: 6 per weight in a matrix product (4 for a frozen one: LoRA's base gets no gradient),
        plus 12 * n_layer * n_embd * the keys each query scores (`attention_span`)."""
        cfg = self.config
        lookups = {id(self.pos_emb.weight) if self.pos_emb is not None else None}
        if not cfg.tie_embeddings:
            lookups.add(id(self.token_emb.weight))
        frozen = sum(
            p.numel() for p in self.parameters() if not p.requires_grad and id(p) not in lookups
        )
        from model.local_attention import attention_span

        attention = 12 * cfg.n_layer * cfg.n_embd * attention_span(seq_len, cfg.window)
        return 6 * self.num_params(non_embedding=True) - 2 * frozen + attention


# --- attention's fast paths: `attend`'s numbers, the weights never written down ---


def attend_fast(q, k, v, mask, dropout):
    """`attend` by the fastest path that computes it: SDPA's fused kernel (`attend_fused`), or for a
    window or documents (a LocalSpan) model/local_attention.py's blocks, at a cost linear in T; bf16
    on a CPU takes the detour through fp32 (`attend_in_fp32`)."""
    if q.device.type == "cpu" and q.dtype == torch.bfloat16:
        return attend_in_fp32(q, k, v, mask, dropout)
    if mask is None or isinstance(mask, torch.Tensor):
        return attend_fused(q, k, v, mask, dropout)
    from model.local_attention import attend_locally  # only models with a window or documents

    return attend_locally(q, k, v, mask, dropout)


def attend_fused(q, k, v, mask, dropout):
    """`attend` (mask None or a boolean tensor) through F.scaled_dot_product_attention, which picks
    a flash kernel; grouped key/value heads serve their query heads uncopied (`enable_gqa`)."""
    causal = mask is None and q.size(2) > 1  # a single query (a step) sees every key
    gqa = k.size(1) != q.size(1)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal, enable_gqa=gqa
    )


def attend_in_fp32(q, k, v, mask, dropout):
    """bf16 on a CPU: `attend_fast` in fp32 outside autocast, the output in bf16: PyTorch's CPU
    flash kernel is several times slower in bf16 (BENCHMARKS.md, "Attention in fp32 under CPU
    autocast")."""
    with torch.autocast("cpu", enabled=False):
        return attend_fast(q.float(), k.float(), v.float(), mask, dropout).to(q.dtype)


# --- activations, rotary positions, norms, dropout ---


class ReLUSquared(torch.autograd.Function):
    """relu(x)^2, as F.relu(x).square() to the bit, with a backward of two passes over the
    activations (2 relu(x) grad) where autograd's takes four (pow's, then relu's): 7% of the
    shakespeare_char_fast step on a CPU (BENCHMARKS.md, "Where a training step's time goes")."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        r = F.relu(x)
        ctx.save_for_backward(r)
        return r * r

    @staticmethod
    @once_differentiable  # a second derivative through it is refused, not wrong
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (r,) = ctx.saved_tensors
        return (grad * r).mul_(2)  # times 2 is exact: the bits of grad * (2 r)


def rotary_angles(positions: torch.Tensor, head_dim: int, base: float):
    """cos and sin of position * frequency, each (len(positions), head_dim // 2): in float64, then
    rounded to float32, so a table and the angles of one position agree to the bit."""
    exponents = (
        torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim
    )
    angles = positions.to(torch.float64)[:, None] * (1.0 / (base**exponents))
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn each pair (x_i, x_{i+d/2}) of x (B, H, T, d) by its position's angle."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)


def make_norm(cfg: GPTConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.n_embd, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.n_embd, eps=cfg.norm_eps or 1e-5, bias=cfg.bias)


class Dropout(nn.Dropout):
    """nn.Dropout that skips nn.Module's call machinery where it is the identity (evaluation, or
    p = 0): 3% of an eager decoding step (BENCHMARKS.md, "Fast defaults")."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return super().__call__(x) if self.training and self.p > 0 else x
