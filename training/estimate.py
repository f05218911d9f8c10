"""What a run will cost, before it starts: parameters, FLOPs, tokens, memory, checkpoint size and time.

`python train.py CONFIG --dry-run` prints `dry_run(cfg)`: parameters (embedding and the rest), training FLOPs
per token, tokens per iteration and in all, epochs, tokens per parameter against Chinchilla's ~20, predicted
peak training memory, checkpoint size, and the time of a few real steps on this machine projected over the
run (or, for a CUDA config on a machine without one, the time on common GPUs from FLOPs at a stated MFU).

The memory model (`memory`) counts what autograd keeps, per token of a micro-batch, tensor by tensor: for
each block the inputs of the norms and matrix products, the attention inputs and output (flash attention
keeps no T x T matrix; with attention dropout the math path does), the MLP's hidden activations, dropout
masks; with a window or documents, what model/attention.py's blocks keep (`local_attention`: the outputs of
their two calls, padded copies, the block-sized score tensors of the math path, one document mask for all
layers); for the head the log-softmax output over the vocabulary. Under autocast the copies cast for matrix
products are 2 bytes a value and the cast weights are kept for backward; on a CPU attention runs in fp32
(model/gpt.py). On top: fp32 weights, the gradients and optimizer state (AdamW 8 bytes a parameter, Muon's
momentum 4) of what trains (with LoRA, the adapters alone), and the working set of the backward pass (about
one block's activations, or the gradient of the logits when the vocabulary is large). The per-tensor counts
were read off autograd's saved tensors (torch.autograd.graph.saved_tensors_hooks; tests/test_estimate.py keeps
checking them); the GPU variant and torch.compile's savings are the same reasoning, not measured here. A
LoRA run's activations are counted as full fine-tuning's (the adapters' own are a rank's worth per token).

`measure_training_memory` measures it instead, in a fresh process: the resident memory the first training
steps add (Linux VmHWM after clear_refs), and how much of it is PyTorch's own code paged in on first use
(file-backed; not training memory). tools/bench.py reports the first number; the tests compare the second
against the prediction.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from common.errors import UserError
from data.dataset import Dataset, Meta
from data.recipes import RECIPES, prepared_dataset
from data.sources import HFText
from model import GPT, GPTConfig
from model.attention import attention_span, block_layout
from model.lora import LoRAConfig, add_lora
from runs import checkpoint
from runs.config import Config, Request, from_arguments
from runs.runtime import compile_enabled, cpu_auto_precision
from training.evaluation import final_eval_wanted
from training.hardware import GPU_PEAKS
from training.plan import follow_model, plan_run
from training.trainer import Run, start_run, train_step

MB = 2**20
CHINCHILLA_TOKENS_PER_PARAM = 20
PROJECTION_MFU = 0.4  # the MFU assumed for GPUs not at hand (nanoGPT reaches ~40% on an A100 for GPT-2 small)
# GPUs the dry run projects to: the name it prints -> the exact product name in hardware.GPU_PEAKS
PROJECTED_GPUS = {
    "H100": "H100 80GB HBM3",
    "A100": "A100-SXM4-80GB",
    "L40S": "L40S",
    "RTX 4090": "GeForce RTX 4090",
    "L4": "L4",
}
CPU_RUNTIME_MB = 15  # PyTorch code paged in by the first steps on a CPU (file-backed; measured, see above)


# --- parameters ---


@dataclass
class Params:
    total: int  # every parameter once (a tied head shares the token embedding)
    embedding: int  # token and learned position embeddings (Kaplan et al.'s "non-embedding" leaves them out)
    linear: int  # in matrix products (the LM head included), cast under autocast
    muon: int  # Muon's share (hidden matrices) when optim.name is muon
    trained: int  # what has gradients and optimizer state: all of them, or with LoRA the adapters
    flops_per_token: float  # training FLOPs per token at the full context (GPT.flops_per_token)
    matmul: int  # weights in matrix products, the 6N of those FLOPs (GPT.num_params())

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding


def count_params(m: GPTConfig, optimizer: str = "adamw", lora: LoRAConfig | None = None) -> Params:
    """Parameter counts of a model (with LoRA adapters), built on the meta device (no memory, no time)."""
    with torch.device("meta"):
        model = GPT(m)
        if lora is not None:
            add_lora(model, lora)
    linear = sum(mod.weight.numel() for mod in model.modules() if isinstance(mod, torch.nn.Linear))
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    muon = 0
    if optimizer == "muon":
        muon = sum(p.numel() for n, p in trained.items() if p.dim() == 2 and n.startswith("blocks."))
    embedding = sum(e.weight.numel() for e in (model.token_emb, model.pos_emb) if e is not None)
    flops = model.flops_per_token(m.block_size)
    total, n_trained = model.num_params(non_embedding=False), sum(p.numel() for p in trained.values())
    return Params(total, embedding, linear, muon, n_trained, flops, model.num_params())


# --- memory ---


@dataclass
class LocalAttention:
    """What model/attention.py's blocks compute per token of a row of T (a window or documents)."""

    blocked: bool  # in blocks; else one call under a dense mask (documents, a window on a short T)
    outputs: float  # query rows its SDPA calls answer (1: each once; more: padding, the first blocks twice)
    scores: float  # keys each query's scores are computed for (attention_span, for this batch size)
    padded: float  # the row padded to whole blocks, over T (1: no padding)
    key_copies: (
        float  # keys per token as the blocks read them (each by reach + 1 blocks; dropout copies them)
    )


def local_attention(m: GPTConfig, batch_size: int) -> LocalAttention | None:
    """None for plain causal attention (no window shorter than T, no documents)."""
    T = m.block_size
    if (m.window is None or m.window >= T) and not m.doc_mask:
        return None
    block, reach = block_layout(T, m.window)
    head = min(T, reach * block) if reach else T
    n = -(-T // block)
    rows = (batch_size * n - reach) * block / (batch_size * T) if head < T else 0.0  # the blocks' queries
    outputs, copies = head / T + rows, head / T + (reach + 1) * rows
    scores = (reach + 1) * block * rows + head * head / T
    return LocalAttention(head < T, outputs, scores, n * block / T, copies)


def _blocks_bytes_per_token(
    m: GPTConfig, local: LocalAttention, a: int, attn_fp32: bool, batch: int
) -> float:
    """What the blocks keep beyond plain causal attention: the outputs of their two SDPA calls apart from
    the assembled output (which the output projection keeps; under CPU autocast as its cast copy), their
    log-sum-exp, copies of q, k, v padded to whole blocks, or of q and k laid out token by token."""
    C, H, kv = m.n_embd, m.n_head, m.kv_heads * m.head_dim
    b = 4 if attn_fp32 else a
    if not local.blocked:
        return 0.0
    reshaped = m.pos_emb == "rope" or m.qk_norm  # plain attention's output copy is counted already
    total = (
        C * b * (local.outputs - 1) + (C * b if b == a and not reshaped else 0) + H * 4 * (local.outputs - 1)
    )
    if local.padded > 1:  # the copies take the place of q, k, v (or of rotated q and k)
        total += (m.n_head * m.head_dim + 2 * kv) * b * (local.padded - 1)
        total -= (C + kv) * b if reshaped and a == b else 0
    elif reshaped and batch > 1:
        total += (C * b if H > 1 else 0) + (kv * b if m.kv_heads > 1 else 0)
    return total


def mask_bytes_per_token(m: GPTConfig, precision: str, device: str, batch_size: int) -> float:
    """The additive masks of a forward pass (documents, or a window's dense T x T mask), shared by all its
    layers (model/attention.py)."""
    local = local_attention(m, batch_size)
    if local is None:
        return 0.0
    b = 4 if precision not in ("bf16", "fp16") or device == "cpu" else 2
    if m.doc_mask:
        return local.scores * b
    return 0.0 if local.blocked else m.block_size * b / batch_size  # one T x T mask for every row


def _flash_bytes_per_token(m: GPTConfig, a: int, attn_fp32: bool, reshaped: bool, qkv: int) -> float:
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
    C, H, F, T = m.n_embd, m.n_head, m.mlp_width, m.block_size
    qkv = (m.n_head + 2 * m.kv_heads) * m.head_dim
    a = 2 if precision in ("bf16", "fp16") else 4  # a value cast for a matrix product
    attn_fp32 = a == 4 or device == "cpu"  # model/gpt.py attends in fp32 under CPU autocast
    reshaped = m.pos_emb == "rope" or m.qk_norm  # q, k made afresh: the attention output is copied once more
    norms = 2 if m.mlp else 1
    total = norms * (C * 4 + C * a + (C * 4 + 4 if m.norm == "rmsnorm" else 8))  # input, output, statistics
    local = local_attention(m, batch_size)  # a window or documents: model/attention.py's blocks
    if m.dropout > 0:  # math path: scaled q, k, v, the output, and three T x T tensors per head
        b = 4 if attn_fp32 else a
        inputs, scores = 3 * C * b, T
        if local is not None:  # q per query row answered, k and v per block that reads them; block scores
            inputs, scores = C * b * (local.outputs + 2 * local.key_copies), local.scores
        total += inputs + 3 * H * scores * b + C * a + norms * C * a  # + a dropout mask per residual branch
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
    C, V = m.n_embd, m.vocab_size
    a = 2 if precision in ("bf16", "fp16") else 4
    total = C * 4 + C * a + (C * 4 + 4 if m.norm == "rmsnorm" else 8) + V * 4 + 16  # norm, log-softmax, ids
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
        """Everything but the weights: what the first steps of a run add (tools/bench.py measures it)."""
        return self.gradients + self.optimizer + self.activations + self.backward

    @property
    def peak(self) -> float:
        return self.weights + self.training


def memory(cfg: Config, precision: str, device: str, params: Params | None = None) -> Memory:
    """The peak memory of training with `cfg` (vocab_size set) at `precision` on `device` (cpu | cuda)."""
    m = cfg.model
    params = params or count_params(m, cfg.optim.name, cfg.lora)
    tokens = cfg.train.batch_size * m.block_size  # one micro-batch
    a = 2 if precision in ("bf16", "fp16") else 4
    block = block_bytes_per_token(m, precision, device, cfg.train.batch_size) * tokens
    head = head_bytes_per_token(m, precision) * tokens
    head += mask_bytes_per_token(m, precision, device, cfg.train.batch_size) * tokens
    casts = 2 * params.linear if a == 2 else 0
    logits_grad = m.vocab_size * (4 + a) * tokens  # the gradient of the log-softmax, then of the logits
    kept, backward = m.n_layer * block, max(block, logits_grad)
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


# --- activation checkpointing (train.activation_checkpointing) ---


def checkpointed(
    m: GPTConfig, tokens: int, block: float, logits_grad: float, device: str
) -> tuple[float, float]:
    """(what the blocks keep, the backward working set) when each block keeps its input alone: the fp32
    residual stream (and its positions). Backward computes one block's activations again, then works through
    them; on a CPU about one block more stays resident (glibc's malloc keeps the freed memory of the blocks
    computed before: measured, BENCHMARKS.md "Activation checkpointing")."""
    kept = m.n_layer * (tokens * m.n_embd * 4 + m.block_size * 8)
    return kept, block * (2 if device == "cpu" else 1) + max(block, logits_grad)


def recompute_share(m: GPTConfig, params: Params) -> float:
    """The FLOPs activation checkpointing adds, over a step's: the blocks' forward (a third of their training
    FLOPs: all but the LM head's) computed again."""
    head = 6 * m.vocab_size * m.n_embd
    return (params.flops_per_token - head) / 3 / params.flops_per_token


def checkpoint_bytes(cfg: Config, params: Params) -> float:
    """A checkpoint folder on disk: fp32 weights (a tied head once; LoRA: the adapters) and the optimizer
    state."""
    return 4 * saved_params(cfg, params) + 8 * (params.trained - params.muon) + 4 * params.muon


def saved_params(cfg: Config, params: Params) -> int:
    """The parameters a checkpoint holds: all of them, or a LoRA run's adapters alone."""
    return params.trained if cfg.lora is not None else params.total


# --- measuring memory (tools/bench.py, tests) ---


def _status_mb(fields: tuple[str, ...]) -> list[float]:
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            name = line.split(":", 1)[0]
            if name in fields:
                found[name] = int(line.split()[1]) / 1024
    if len(found) < len(fields):
        raise UserError("/proc/self/status lacks memory fields: CPU memory measurement needs Linux")
    return [found[name] for name in fields]


CLEAR_REFS = "/proc/self/clear_refs"  # Linux: writing 5 resets the peak resident size (VmHWM) to the current


def _memory_probe(args: list[str]) -> tuple[float, float] | None:
    """In a fresh process: (memory added by the first training steps, in MB; the part of it that is PyTorch's
    code paged in on first use). CPU: resident memory, where Linux's /proc lets it be measured (else None:
    macOS, Windows, some sandboxes); MPS: what the Metal driver allocated."""
    run = start_run(plan_run(from_arguments(args)))
    if run.rt.device.type == "mps":
        before = torch.mps.driver_allocated_memory()
        for it in range(2):
            train_step(run, it)
        torch.mps.synchronize()
        return (torch.mps.driver_allocated_memory() - before) / 2**20, 0.0
    try:
        with open(CLEAR_REFS, "w") as f:
            f.write("5")
        rss, files = _status_mb(("VmRSS", "RssFile"))
    except OSError:
        return None
    for it in range(2):
        train_step(run, it)
    peak, files_after = _status_mb(("VmHWM", "RssFile"))
    return peak - rss, files_after - files


def measure_training_memory(args: list[str]) -> tuple[float, float] | None:
    """`_memory_probe` of the run `CONFIG [section.key=value ...]` asks for, in a fresh process (so nothing
    this one allocated counts); None where it cannot."""
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(_memory_probe, (args,))


# --- time ---


@dataclass
class Timing:
    step_s: float  # one micro-batch forward + backward and one optimizer step, median
    forward_s: float  # one eval batch forward, median
    first_s: float  # the first step (optimizer state allocated; compiling, when on)
    steps: int  # timed


def time_steps(run: Run, budget_s: float = 3.0, max_steps: int = 20) -> Timing:
    """Time real training steps of `run` (built with grad_accum 1) and eval forwards on this device."""
    rt = run.rt

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        rt.synchronize()
        return time.perf_counter() - start

    first = timed(lambda: train_step(run, 0))
    timed(lambda: train_step(run, 1))
    times: list[float] = []
    while len(times) < 3 or (sum(times) < budget_s and len(times) < max_steps):
        it = len(times) + 2
        times.append(timed(lambda: train_step(run, it)))  # noqa: B023 (called at once)
    x, y = run.splits["val"].batch(0, run.cfg.train.batch_size, stream=1)

    def forward():
        with torch.no_grad(), rt.autocast():
            run.forward(x, y)

    run.forward.eval()
    forwards = [timed(forward) for _ in range(4)][1:]
    run.forward.train()
    return Timing(statistics.median(times), statistics.median(forwards), first, len(times))


# --- the dry run ---


def _dataset_meta(cfg: Config) -> Meta | None:
    """The dataset's meta.json; a known dataset made from local text is prepared first (seconds), one from the
    hub is not (it could be hours): None."""
    name, data_dir = cfg.data.dataset, cfg.data.dir
    if Dataset.is_prepared(name, data_dir):
        return Dataset.open(name, data_dir).meta
    recipe = RECIPES.get(name)
    if recipe is None or isinstance(recipe.source, HFText):
        return None
    return prepared_dataset(name, data_dir).meta


def target_device(cfg: Config) -> tuple[str, str, bool]:
    """(device type, precision, present) the config trains on; a CUDA config without a GPU: present False."""
    setting, cuda = cfg.train.device, torch.cuda.is_available()
    mps = torch.backends.mps.is_available()
    if setting == "cuda" or (setting == "auto" and cuda):
        precision = cfg.train.precision
        if precision == "auto":
            precision = "bf16" if not cuda or torch.cuda.is_bf16_supported() else "fp16"
        return "cuda", precision, cuda
    if setting == "mps" or (setting == "auto" and mps):
        return "mps", "fp32" if cfg.train.precision == "auto" else cfg.train.precision, mps
    precision = cpu_auto_precision(cfg.model.n_embd) if cfg.train.precision == "auto" else cfg.train.precision
    return "cpu", precision, True


def _mb(n: float) -> str:
    return f"{n / MB:,.1f} MB" if n < 2**30 else f"{n / 2**30:,.1f} GB"


def _duration(s: float) -> str:
    if s < 1:
        return "under 1 s"
    if s < 120:
        return f"{s:.0f} s"
    if s < 2 * 3600:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h" if s < 72 * 3600 else f"{s / 86400:.1f} days"


def _available_bytes(device: str) -> float | None:
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.mem_get_info()[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def dry_run(request: Request) -> str:
    """The dry run's report (nothing is trained or written, except preparing a local dataset once)."""
    cfg = request.cfg
    meta = _dataset_meta(cfg)
    vocab = cfg.model.vocab_size or (meta.vocab_size if meta else None)
    if vocab is None:
        raise UserError(
            f"dataset {cfg.data.dataset} is not prepared, so its vocabulary is unknown; set model.vocab_size "
            "for the dry run, or prepare the dataset first"
        )
    # the document token's id does not change the cost: any will do for the counts
    doc_token = 0 if cfg.model.doc_mask and cfg.model.doc_token is None else cfg.model.doc_token
    cfg = dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab, doc_token=doc_token)
    )
    if cfg.train.init_from:  # the shape of the weights it starts from (training/plan.py's rule)
        source = checkpoint.load_pretrained(cfg.train.init_from, hub=True)
        shape, where = source.model, source.where
        del source  # only the shape is needed here: the timing below reads the weights itself
        cfg = follow_model(cfg, shape, request.origins, f"train.init_from {where}")
    device, precision, present = target_device(cfg)
    params = count_params(cfg.model, cfg.optim.name, cfg.lora)
    mem = memory(cfg, precision, device, params)
    lines = [f"dry run of {request.name}: nothing is trained or written", ""]
    lines += _model_lines(cfg, params)
    timing, why_not = None, None
    if not present:
        why_not = f"train.device={cfg.train.device} but no CUDA GPU is visible here"
    elif meta is None:
        why_not = f"dataset {cfg.data.dataset} is not prepared (train.py prepares it on first use)"
    elif (_available_bytes(device) or float("inf")) < mem.peak:
        why_not = "the predicted memory does not fit in what is free here"
    else:
        timing = _time(cfg, request.origins)
    lines += _token_lines(cfg, meta, timing, params)
    lines += _memory_lines(cfg, mem, params, present)
    lines += _time_lines(cfg, meta, params, timing, why_not, device, precision)
    return "\n".join(lines)


def _time(cfg: Config, origins: dict[str, str]) -> Timing:
    """Real steps of this config on this machine, one micro-batch each (grad_accum 1), nothing saved. The
    `origins` of its keys keep a lowered block_size and a dropout where train.init_from's model has others."""
    train = dataclasses.replace(cfg.train, grad_accum=1, resume=False, save=False)
    run = start_run(plan_run(Request(dataclasses.replace(cfg, train=train), origins)))
    return time_steps(run)


def _iterations(cfg: Config, timing: Timing | None) -> int:
    """Iterations the run will take: max_iters, or fewer where train.max_time ends it first."""
    if cfg.train.max_time and timing is not None:
        micro = cfg.train.grad_accum
        return min(cfg.train.max_iters, int(cfg.train.max_time / (timing.step_s * micro)))
    return cfg.train.max_iters


def _model_lines(cfg: Config, params: Params) -> list[str]:
    m, flops = cfg.model, params.flops_per_token
    tied = ", the LM head tied to the token embedding" if m.tie_embeddings else ""
    span = attention_span(m.block_size, m.window)
    attention = 12 * m.n_layer * m.n_embd * span  # GPT.flops_per_token's
    per_weight = "6 x" if cfg.lora is None else "6 per trained, 4 per frozen one of"
    block, reach = block_layout(m.block_size, m.window)
    local = [f"a window of {m.window} tokens, in blocks of {block}"] if reach else []
    local += ["within documents"] if m.doc_mask else []
    lines = [
        f"model       {params.total / 1e6:,.2f}M parameters: {params.non_embedding / 1e6:,.2f}M "
        f"non-embedding + {params.embedding / 1e6:,.2f}M embedding{tied}",
        f"            {m.n_layer} layers x {m.n_embd}, {m.n_head} heads, context {m.block_size}, vocabulary "
        f"{m.vocab_size:,}",
        f"compute     {flops / 1e6:,.1f} MFLOP per token trained: {per_weight} {params.matmul / 1e6:,.2f}M "
        f"weights in matrix products + {attention / 1e6:,.1f}M in attention",
    ]
    if local:
        lines.append(f"            {' and '.join(local)}: attention scores for {span:,.0f} keys per query")
    return lines + _lora_lines(cfg, params)


def _lora_lines(cfg: Config, params: Params) -> list[str]:
    if cfg.lora is None:
        return []
    lc = cfg.lora
    return [
        f"lora        rank {lc.rank} on {', '.join(lc.targets)}: {params.trained / 1e6:,.3f}M parameters "
        f"train ({params.trained / params.total:.2%}); the base is frozen: no gradients or optimizer state, "
        "and 4 FLOPs per frozen weight instead of 6 (no weight gradient)"
    ]


def _token_lines(cfg: Config, meta: Meta | None, timing: Timing | None, params: Params) -> list[str]:
    per_iter = cfg.tokens_per_iter
    iters = _iterations(cfg, timing)
    total = per_iter * iters
    by = f"{iters:,} iterations" + (" (train.max_time ends it first)" if iters < cfg.train.max_iters else "")
    if cfg.train.max_time and timing is None:
        by += f", or fewer: train.max_time={cfg.train.max_time:g}s"
    epochs = (
        f" = {total / meta.train_tokens:,.2f} epochs of the {meta.train_tokens:,}-token train split"
        if meta
        else ""
    )
    return [
        f"tokens      {per_iter:,} per iteration x {by} = {total:,} tokens{epochs}",
        f"            {total / params.total:,.1f} tokens per parameter (Chinchilla-optimal is about "
        f"{CHINCHILLA_TOKENS_PER_PARAM})",
    ]


def _memory_lines(cfg: Config, mem: Memory, params: Params, present: bool) -> list[str]:
    optimizer = "AdamW + Muon state" if params.muon else "AdamW state"
    lines = [
        f"memory      peak {_mb(mem.peak)} training on {mem.device} in {mem.precision}: weights "
        f"{_mb(mem.weights)} + gradients {_mb(mem.gradients)} + {optimizer} {_mb(mem.optimizer)}",
        f"            + activations {_mb(mem.activations)} (micro-batch {cfg.train.batch_size} x "
        f"{cfg.model.block_size} tokens) + backward working set {_mb(mem.backward)}"
        + (f"; plus ~{CPU_RUNTIME_MB} MB of PyTorch code paged in" if mem.device == "cpu" else ""),
    ]
    other = "fp32" if mem.precision in ("bf16", "fp16") else "bf16"
    if mem.device in ("cpu", "cuda"):
        alt = memory(cfg, other, mem.device, params)
        lines.append(f"            in {other} instead: {_mb(alt.peak)}")
    if compile_enabled(cfg.train.compile, torch.device(mem.device)):
        lines.append(
            "            torch.compile on: counted as eager (compiled peaks measured within a few percent of "
            "eager on a CPU, plus the compiler's own memory)"
        )
    lines += _checkpointing_lines(cfg, mem, params)
    free = _available_bytes(mem.device) if present else None
    if free is not None:
        fits = "fits" if mem.peak < free else "DOES NOT FIT: lower train.batch_size (raise train.grad_accum)"
        if mem.peak >= free and not cfg.train.activation_checkpointing:
            fits += " or set train.activation_checkpointing=true"
        lines.append(f"            {_mb(free)} free here: {fits}")
    size = checkpoint_bytes(cfg, params)
    lines.append(
        f"checkpoint  {_mb(size)} on disk (weights {_mb(4 * saved_params(cfg, params))} + optimizer state "
        f"{_mb(size - 4 * saved_params(cfg, params))}); best/ shares last/'s files"
    )
    if Path(cfg.train.out_dir).exists():
        lines[-1] += f"; {_mb(shutil.disk_usage(cfg.train.out_dir).free)} free in {cfg.train.out_dir}"
    return lines


def _checkpointing_lines(cfg: Config, mem: Memory, params: Params) -> list[str]:
    """With train.activation_checkpointing: what it saves (against the same run without it) and costs."""
    if not cfg.train.activation_checkpointing:
        return []
    train = dataclasses.replace(cfg.train, activation_checkpointing=False)
    plain = memory(dataclasses.replace(cfg, train=train), mem.precision, mem.device, params)
    return [
        f"            activation checkpointing: {_mb(plain.peak - mem.peak)} less than without it "
        f"({_mb(plain.peak)}); backward computes the blocks' forward again: "
        f"+{recompute_share(cfg.model, params):.0%} FLOPs, counted in the time below"
    ]


def _time_lines(
    cfg: Config,
    meta: Meta | None,
    params: Params,
    timing: Timing | None,
    why_not: str | None,
    device: str,
    precision: str,
) -> list[str]:
    m, t = cfg.model, cfg.train
    iters = _iterations(cfg, timing)
    tokens = iters * cfg.tokens_per_iter
    lines = []
    if timing is not None:
        step = timing.step_s * t.grad_accum
        evals = iters // t.eval_interval + 1 + (1 if iters % t.eval_interval else 0)
        eval_s = 2 * t.eval_iters * timing.forward_s
        exact = ""
        total = iters * step + evals * eval_s
        if meta and final_eval_wanted(t.final_eval, meta.val_tokens):
            final_s = meta.val_tokens * timing.forward_s / (t.batch_size * m.block_size)
            exact, total = f" + exact val eval {_duration(final_s)}", total + final_s
        per = f" ({t.grad_accum} micro-steps)" if t.grad_accum > 1 else ""
        lines += [
            f"speed       {step * 1e3:,.1f} ms per iteration{per} on {device} in {precision} "
            f"(median of {timing.steps} steps after 2; the first took {timing.first_s:.2f} s) = "
            f"{cfg.tokens_per_iter / step:,.0f} tokens/s",
            f"time        training {_duration(iters * step)} + {evals} evals x {eval_s:.1f} s{exact} = about "
            f"{_duration(total)} (checkpoint writes not counted)",
        ]
    else:
        lines.append(f"time        not measured: {why_not}")
    if timing is None or (device != "cuda" and iters * timing.step_s * t.grad_accum > 3600):
        flops = tokens * params.flops_per_token
        if t.activation_checkpointing:  # the blocks' forward again: time the MFU does not count
            flops *= 1 + recompute_share(m, params)
        projected = []
        for gpu, product in PROJECTED_GPUS.items():
            peaks = GPU_PEAKS[product]
            peak = peaks.get("bf16") or peaks["fp16"]
            projected.append(f"{gpu} {_duration(flops / (peak * 1e12 * PROJECTION_MFU))}")
        lines.append(
            f"on a GPU    {flops:.2g} FLOPs at {PROJECTION_MFU:.0%} MFU of the bf16 peak: "
            + ", ".join(projected)
        )
    return lines
