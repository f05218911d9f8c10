"""What a run will cost, before it starts: parameters, FLOPs, tokens, memory, checkpoint size and time.

`python train.py CONFIG --dry-run` prints `dry_run(cfg)`: parameters (embedding and the rest), training FLOPs
per token, tokens per iteration and in all, epochs, tokens per parameter against Chinchilla's ~20, predicted
peak training memory (training/memory.py), checkpoint size, and the time of a few real steps on this machine
(training/measure.py) projected over the run (or, for a CUDA config on a machine without one, the time on
common GPUs from FLOPs at a stated MFU).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch

from common.errors import UserError
from data.dataset import Dataset, Meta
from data.recipes import RECIPES, prepared_dataset
from data.sources import HFText
from model.attention import attention_span, block_layout
from runs.config import Config, Request
from runs.pretrained import load_pretrained
from runs.runtime import compile_enabled, cpu_auto_precision
from training.evaluation import final_eval_wanted
from training.hardware import GPU_PEAKS
from training.measure import Timing, time_steps
from training.memory import Memory, Params, checkpoint_bytes, count_params, memory, saved_params
from training.plan import follow_model, plan_run
from training.trainer import start_run

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
        source = load_pretrained(cfg.train.init_from, hub=True)
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
    free = _available_bytes(mem.device) if present else None
    if free is not None:
        fits = "fits" if mem.peak < free else "DOES NOT FIT: lower train.batch_size (raise train.grad_accum)"
        lines.append(f"            {_mb(free)} free here: {fits}")
    size = checkpoint_bytes(cfg, params)
    lines.append(
        f"checkpoint  {_mb(size)} on disk (weights {_mb(4 * saved_params(cfg, params))} + optimizer state "
        f"{_mb(size - 4 * saved_params(cfg, params))}); best/ shares last/'s files"
    )
    if Path(cfg.train.out_dir).exists():
        lines[-1] += f"; {_mb(shutil.disk_usage(cfg.train.out_dir).free)} free in {cfg.train.out_dir}"
    return lines


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
