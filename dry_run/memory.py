"""The memory of training, predicted: what autograd keeps, tensor by tensor, and what trains.

`memory` counts per token of a micro-batch what each block keeps for backward (norm and matmul
inputs, attention inputs and output, the MLP's hidden activations, dropout masks; a window's or
documents' blocks, model/local_attention.py) and the head's log-softmax; under autocast the 2-byte
copies and cast weights. On top: fp32 weights, the gradients and optimizer state of what trains, and
the backward pass's working set. The counts were read off autograd's saved tensors
(saved_tensors_hooks); tests/test_estimate.py keeps checking them against dry_run/measure.py's
measurement. `final_eval_memory` counts the exact val eval at the end of a run: its forwards keep
nothing for backward but take many windows at once (`forward_peak`, read off the tensors a forward
holds). What is counted, and what is not measured (the GPU, torch.compile's savings, LoRA), is in
docs/training.md, "What a run will cost".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model import GPT, GPTConfig
from model.config import LoRAConfig
from model.local_attention import attention_span, block_layout
from model.lora import add_lora
from runs.config import Config


@dataclass
class Params:
    total: int  # every parameter once (a tied head shares the token embedding)
    # token and learned position embeddings (Kaplan et al.'s "non-embedding" leaves them out)
    embedding: int
    linear: int  # in matrix products (the LM head included), cast under autocast
    muon: int  # Muon's share (hidden matrices) when optim.name is muon
    trained: int  # what has gradients and optimizer state: all of them, or with LoRA the adapters
    flops_per_token: float  # training FLOPs per token at the full context (GPT.flops_per_token)
    matmul: int  # weights in matrix products, the 6N of those FLOPs (GPT.num_params())
    span: float  # keys each query's attention scores cover (a window or documents shorten it)

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding


def count_params(m: GPTConfig, optimizer: str = "adamw", lora: LoRAConfig | None = None) -> Params:
    """Parameter counts of a model (with LoRA adapters), built on the meta device (no memory, no
    time)."""
    with torch.device("meta"):
        model = GPT(m)
        if lora is not None:
            add_lora(model, lora)
    linear = sum(mod.weight.numel() for mod in model.modules() if isinstance(mod, torch.nn.Linear))
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    muon = 0
    if optimizer == "muon":
        muon = sum(
            p.numel() for n, p in trained.items() if p.dim() == 2 and n.startswith("blocks.")
        )
    embedding = sum(e.weight.numel() for e in (model.token_emb, model.pos_emb) if e is not None)
    flops = model.flops_per_token(m.block_size)
    total = model.num_params(non_embedding=False)
    n_trained = sum(p.numel() for p in trained.values())
    span = attention_span(m.block_size, m.window)
    return Params(total, embedding, linear, muon, n_trained, flops, model.num_params(), span)


@dataclass
class LocalAttention:
    """What model/local_attention.py's blocks compute per token of a row of T (a window or
    documents)."""

    blocked: bool  # in blocks; else one call under a dense mask (documents, a window on a short T)
    # query rows its SDPA calls answer (1: each once; more: padding, the first blocks twice)
    outputs: float
    scores: float  # keys each query's scores are computed for (attention_span, for this batch size)
    padded: float  # the row padded to whole blocks, over T (1: no padding)
    key_copies: (
        # keys per token as the blocks read them (each by reach + 1 blocks; dropout copies them)
        float
    )


def local_attention(m: GPTConfig, batch_size: int) -> LocalAttention | None:
    """None for plain causal attention (no window shorter than T, no documents)."""
    T = m.block_size
    if (m.window is None or m.window >= T) and not m.doc_mask:
        return None
    block, reach = block_layout(T, m.window)
    head = min(T, reach * block) if reach else T
    n = -(-T // block)
    # the blocks' queries
    rows = (batch_size * n - reach) * block / (batch_size * T) if head < T else 0.0
    outputs = head / T + rows
    copies = head / T + (reach + 1) * rows
    scores = (reach + 1) * block * rows + head * head / T
    return LocalAttention(head < T, outputs, scores, n * block / T, copies)


def _blocks_bytes_per_token(
    m: GPTConfig, local: LocalAttention, a: int, attn_fp32: bool, batch: int
) -> float:
    """What the blocks keep beyond plain causal attention: the outputs of their two SDPA calls apart
    from the assembled output (which the output projection keeps; under CPU autocast as its cast
    copy), their log-sum-exp, copies of q, k, v padded to whole blocks, or of q and k laid out token
    by token."""
    C = m.n_embd
    H = m.n_head
    kv = m.kv_heads * m.head_dim
    b = 4 if attn_fp32 else a
    if not local.blocked:
        return 0.0
    reshaped = m.pos_emb == "rope" or m.qk_norm  # plain attention's output copy is counted already
    total = (
        C * b * (local.outputs - 1)
        + (C * b if b == a and not reshaped else 0)
        + H * 4 * (local.outputs - 1)
    )
    if local.padded > 1:  # the copies take the place of q, k, v (or of rotated q and k)
        total += (m.n_head * m.head_dim + 2 * kv) * b * (local.padded - 1)
        total -= (C + kv) * b if reshaped and a == b else 0
    elif reshaped and batch > 1:
        total += (C * b if H > 1 else 0) + (kv * b if m.kv_heads > 1 else 0)
    return total


def mask_bytes_per_token(m: GPTConfig, precision: str, device: str, batch_size: int) -> float:
    """The additive masks of a forward pass (documents, or a window's dense T x T mask), shared by
    all its layers (model/local_attention.py)."""
    local = local_attention(m, batch_size)
    if local is None:
        return 0.0
    b = 4 if precision not in ("bf16", "fp16") or device == "cpu" else 2
    if m.doc_mask:
        return local.scores * b
    return 0.0 if local.blocked else m.block_size * b / batch_size  # one T x T mask for every row


def _flash_bytes_per_token(
    m: GPTConfig, a: int, attn_fp32: bool, reshaped: bool, qkv: int
) -> float:
    """What plain causal flash attention keeps per token (q, k, v, its output, log-sum-exp)."""
    C = m.n_embd
    if a == 4:  # fp32: q, k, v are views of the QKV output
        kv = m.kv_heads * m.head_dim  # GQA: SDPA's enable_gqa copies nothing
        total = qkv * 4 + ((2 * C + kv) * 4 if reshaped else 0) + C * 4
    elif attn_fp32:  # autocast on a CPU: fp32 copies of q, k, v (qk-norm casts q and k once more)
        total = qkv * 4 + (2 * C * 4 if m.qk_norm else 0) + C * 4 + C * a
    else:  # autocast on a GPU: attention in the autocast type
        total = qkv * a + (2 * C * (4 + a) if m.qk_norm else 0)
        total += (2 * C * a if m.pos_emb == "rope" else 0) + C * a + (C * a if reshaped else 0)
    return total + m.n_head * 4  # attention's log-sum-exp


def block_bytes_per_token(m: GPTConfig, precision: str, device: str, batch_size: int = 1) -> float:
    """Bytes one block keeps for backward per token of a micro-batch (see the module docstring)."""
    C = m.n_embd
    H = m.n_head
    F = m.mlp_width
    T = m.block_size
    qkv = (m.n_head + 2 * m.kv_heads) * m.head_dim
    a = 2 if precision in ("bf16", "fp16") else 4  # a value cast for a matrix product
    attn_fp32 = a == 4 or device == "cpu"  # model/gpt.py attends in fp32 under CPU autocast
    # q, k made afresh: the attention output is copied once more
    reshaped = m.pos_emb == "rope" or m.qk_norm
    norms = 2 if m.mlp else 1
    # input, output, statistics
    total = norms * (C * 4 + C * a + (C * 4 + 4 if m.norm == "rmsnorm" else 8))
    # a window or documents: model/local_attention.py's blocks
    local = local_attention(m, batch_size)
    if m.dropout > 0:  # math path: scaled q, k, v, the output, and three T x T tensors per head
        b = 4 if attn_fp32 else a
        inputs = 3 * C * b
        scores = T
        # q per query row answered, k and v per block that reads them; block scores
        if local is not None:
            inputs = C * b * (local.outputs + 2 * local.key_copies)
            scores = local.scores
        # + a dropout mask per residual branch
        total += inputs + 3 * H * scores * b + C * a + norms * C * a
        total += H * 4  # a log-sum-exp
    else:
        total += _flash_bytes_per_token(m, a, attn_fp32, reshaped, qkv)
        if local is not None:
            total += _blocks_bytes_per_token(m, local, a, attn_fp32, batch_size)
    if m.mlp:
        total += (4 if m.activation == "swiglu" else 2) * F * a
    return total


def head_bytes_per_token(m: GPTConfig, precision: str) -> float:
    """Bytes the embedding, final norm and LM head keep for backward per token."""
    C = m.n_embd
    V = m.vocab_size
    a = 2 if precision in ("bf16", "fp16") else 4
    # norm, log-softmax, ids
    total = C * 4 + C * a + (C * 4 + 4 if m.norm == "rmsnorm" else 8) + V * 4 + 16
    if m.logit_softcap:
        total += V * a  # tanh's output
    if m.dropout > 0:
        total += C * 4  # the embedding dropout's mask
    return total


@dataclass
class Memory:
    """Predicted peak memory of training, in bytes, by what holds it."""

    weights: float
    gradients: float
    optimizer: float
    activations: float  # kept for backward, cast weights included
    backward: float  # the backward pass's working set on top
    device: str
    precision: str

    @property
    def training(self) -> float:
        """Everything but the weights: what the first steps of a run add (tools.bench measures
        it)."""
        return self.gradients + self.optimizer + self.activations + self.backward

    @property
    def peak(self) -> float:
        return self.weights + self.training


def memory(cfg: Config, precision: str, device: str, params: Params | None = None) -> Memory:
    """The peak memory of training with `cfg` (vocab_size set) at `precision` on `device` (cpu |
    cuda)."""
    m = cfg.model
    params = params or count_params(m, cfg.optim.name, cfg.lora)
    tokens = cfg.train.batch_size * m.block_size  # one micro-batch
    a = 2 if precision in ("bf16", "fp16") else 4
    block = block_bytes_per_token(m, precision, device, cfg.train.batch_size) * tokens
    head = head_bytes_per_token(m, precision) * tokens
    head += mask_bytes_per_token(m, precision, device, cfg.train.batch_size) * tokens
    casts = 2 * params.linear if a == 2 else 0
    # the gradient of the log-softmax, then of the logits
    logits_grad = m.vocab_size * (4 + a) * tokens
    kept = m.n_layer * block
    backward = max(block, logits_grad)
    if cfg.train.activation_checkpointing:
        kept, backward = checkpointed(m, tokens, block, logits_grad, device)
    return Memory(
        weights=4 * params.total,
        gradients=4 * params.trained,
        optimizer=8 * (params.trained - params.muon) + 4 * params.muon,
        activations=kept + head + casts,
        backward=backward,
        device=device,
        precision=precision,
    )


# --- the exact eval at the end: forwards without gradients ---


def final_eval_memory(
    cfg: Config, precision: str, device: str, batch: int, params: Params
) -> float:
    """The peak of the exact val eval at the end of a run (training/evaluation.py's
    `evaluate_tokens`, `batch` windows a forward, no gradients): the weights and optimizer state
    (the gradients are freed by then) and what one forward holds at its peak (`forward_peak`). A
    large vocabulary's logits can make it the run's peak."""
    kept = 4 * params.total + 8 * (params.trained - params.muon) + 4 * params.muon
    return kept + forward_peak(cfg.model, precision, device, batch)


def forward_peak(m: GPTConfig, precision: str, device: str, batch: int) -> float:
    """Bytes a forward of `batch` windows without gradients holds at its peak, beyond the weights.
    Nothing is kept for backward: each tensor is freed once the next op has read it, so the peak
    is the largest of three moments of the last block and the head, each with the 2-byte copies of
    the weights autocast has cast by then, plus the pass's masks. Counted as the tensors a forward
    holds (tests/test_estimate.py checks it against them); a process's resident size can be larger:
    the allocator keeps freed blocks (BENCHMARKS.md, "The dry run: predicted against measured")."""
    tokens = batch * m.block_size
    a = 2 if precision in ("bf16", "fp16") else 4
    b = 4 if a == 4 or device == "cpu" else a  # model/gpt.py attends in fp32 under CPU autocast
    attention, mlp = _layer_weights(m)
    cast = 0 if a == 4 else 2  # bytes of each weight's autocast copy, kept to the pass's end
    blocks = m.n_layer * (sum(attention) + sum(mlp))  # the LM head is cast last
    moments = [
        # at the last block's attention: its W_O and its MLP not cast yet
        _attention_live(m, a, b, batch) * tokens + cast * (blocks - attention[1] - sum(mlp)),
        # at the last MLP's activation: its W_out not cast yet
        _mlp_live(m, a) * tokens + cast * (blocks - mlp[1]) if m.mlp else 0.0,
        _head_live(m, a) * tokens + cast * (blocks + m.vocab_size * m.n_embd),
    ]
    return mask_bytes_per_token(m, precision, device, batch) * tokens + max(moments)


def _layer_weights(m: GPTConfig) -> tuple[tuple[int, int], tuple[int, int]]:
    """The weights of one block's matrix products: (W_QKV, W_O), (W_in, W_out) (none without an
    MLP)."""
    C = m.n_embd
    qkv = C * (m.n_head + 2 * m.kv_heads) * m.head_dim
    if not m.mlp:
        return (qkv, C * C), (0, 0)
    w_in = C * m.mlp_width * (2 if m.activation == "swiglu" else 1)
    return (qkv, C * C), (w_in, m.mlp_width * C)


def _attention_live(m: GPTConfig, a: int, b: int, batch: int) -> float:
    """Bytes per token at the last block's attention: its input (the caller holds it), norm1's
    output, W_QKV's output (q, k, v are views of it), q and k made afresh by rotary or QK-norm; at
    SDPA their fp32 copies under CPU autocast and the output (and a window's blocks: padded
    token-major copies, the blocks' outputs and the output assembled), or after it the output and
    W_O's."""
    C = m.n_embd
    kv = m.kv_heads * m.head_dim
    qkv = C + 2 * kv
    base = 8 * C + qkv * a + ((C + kv) * a if m.pos_emb == "rope" or m.qk_norm else 0)
    sdpa = base + (qkv * b if b != a else 0) + C * b + m.n_head * 4  # + its log-sum-exp
    local = local_attention(m, batch)
    if local is not None and local.blocked:
        made = m.pos_emb == "rope" or m.qk_norm  # not token-major: copied
        copies = qkv * b * local.padded if local.padded > 1 else ((C + kv) * b if made else 0)
        sdpa += copies + C * b * (local.outputs - 1) + C * b * local.padded
    return max(sdpa, base + 2 * C * a)


def _mlp_live(m: GPTConfig, a: int) -> float:
    """Bytes per token at the last MLP's activation: the block's input, the residual after
    attention, norm2's output, and the hidden activations the activation holds at once (GELU: its
    input and output; ReLU^2 three; SwiGLU the two halves' input, SiLU's output and the product)."""
    held = {"gelu": 2, "gelu_tanh": 2, "relu2": 3, "swiglu": 4}[m.activation]
    return 12 * m.n_embd + held * m.mlp_width * a


def _head_live(m: GPTConfig, a: int) -> float:
    """Bytes per token at the head: the final norm's output and the logits (a soft cap's division
    and tanh beside them), or after it the logits, their fp32 copy and cross-entropy's
    log-softmax."""
    V = m.vocab_size
    logits = 4 * m.n_embd + V * a * (3 if m.logit_softcap else 1)
    return max(logits, V * a + (V * 4 if a == 2 else 0) + V * 4)


# --- activation checkpointing (train.activation_checkpointing) ---


def checkpointed(
    m: GPTConfig, tokens: int, block: float, logits_grad: float, device: str
) -> tuple[float, float]:
    """(what the blocks keep, the backward working set) when each block keeps its input alone: the
    fp32 residual stream (and its positions). Backward computes one block's activations again, then
    works through them; on a CPU about one block more stays resident (glibc's malloc keeps the freed
    memory of the blocks computed before: measured, BENCHMARKS.md "Activation checkpointing")."""
    kept = m.n_layer * (tokens * m.n_embd * 4 + m.block_size * 8)
    return kept, block * (2 if device == "cpu" else 1) + max(block, logits_grad)


def recompute_share(m: GPTConfig, params: Params) -> float:
    """The FLOPs activation checkpointing adds, over a step's: the blocks' forward (a third of their
    training FLOPs: all but the LM head's) computed again."""
    head = 6 * m.vocab_size * m.n_embd
    return (params.flops_per_token - head) / 3 / params.flops_per_token


def checkpoint_bytes(cfg: Config, params: Params) -> float:
    """A checkpoint folder on disk: fp32 weights (a tied head once; LoRA: the adapters) and the
    optimizer state."""
    return 4 * saved_params(cfg, params) + 8 * (params.trained - params.muon) + 4 * params.muon


def saved_params(cfg: Config, params: Params) -> int:
    """The parameters a checkpoint holds: all of them, or a LoRA run's adapters alone."""
    return params.trained if cfg.lora is not None else params.total
