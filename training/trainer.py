"""A training run, built in one pass from its plan, and the steps it takes.

`start_run(plan)` builds the model (seeded, or with the weights of the checkpoint it resumes or of
train.init_from; with LoRA, the base's weights frozen and adapters beside them, model/lora.py), wrapped for
DDP/FSDP and compiled when asked, its optimisers (for what trains: the adapters alone, with LoRA) and
GradScaler, the dataset's token windows, and restores a resumed run's state. `train_step` runs one iteration
and reads nothing back (a step whose loss or gradient is not finite is skipped on the device), so the GPU
never waits for the host.
`estimate_loss` estimates the loss on fixed batches; `save_checkpoint` writes OUT_DIR/last (and best).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from common.threads import ThreadTuner
from data.dataset import Dataset
from data.loader import TokenWindows
from data.sources import SPLITS
from data.tokenizers import bits_per_byte
from model import GPT
from model.lora import add_lora
from runs import checkpoint
from runs.config import Config
from runs.pretrained import load_into, lora_base
from runs.runtime import Runtime, compile_enabled
from runs.train_state import STATE, Progress, TrainState
from training import distributed
from training.optim import make_optimizers, step_unless
from training.plan import Plan


@dataclass
class Run:
    cfg: Config  # final (training/plan.py)
    rt: Runtime
    dataset: Dataset
    splits: dict[str, TokenWindows]
    model: GPT  # the network (sharded in place under FSDP)
    forward: torch.nn.Module  # what forward passes call: the model or its DDP wrapper, compiled when asked
    optimizers: list[torch.optim.Optimizer]
    scaler: torch.amp.GradScaler  # enabled for fp16 only; a pass-through otherwise
    progress: Progress
    byte_lengths: torch.Tensor | None = None  # UTF-8 bytes of each token id, for bits per byte
    lora_base: dict[str, str] | None = None  # a LoRA run: its base, as checkpoints record it
    tuner: ThreadTuner | None = None  # the CPU thread count of the training steps, timed as they run

    @property
    def out_dir(self) -> Path:
        return Path(self.cfg.train.out_dir)

    @property
    def micro_steps(self) -> int:
        return self.cfg.train.grad_accum // self.rt.world_size

    @property
    def compiled(self) -> bool:
        return hasattr(self.forward, "_orig_mod")  # torch.compile's wrapper


def start_run(plan: Plan) -> Run:
    """Everything a run needs, built from its plan (see the module docstring)."""
    cfg, rt, t = plan.cfg, plan.rt, plan.cfg.train
    torch.manual_seed(t.seed)
    model = build_model(plan)
    base = lora_base(plan.pretrained) if cfg.lora is not None else None  # what its checkpoints record
    forward = distributed.wrap(model, cfg, rt)
    optimizers = make_optimizers(model, cfg.optim, rt.device)
    scaler = torch.amp.GradScaler(rt.device.type, enabled=rt.precision == "fp16")
    if compile_enabled(t.compile, rt.device):
        forward = torch.compile(forward, mode=t.compile_mode)
    lengths = plan.dataset.byte_lengths()
    lengths = torch.from_numpy(lengths).to(rt.device) if lengths is not None else None
    splits = {s: plan.dataset.windows(s, cfg.model.block_size, rt.device, t.seed) for s in SPLITS}
    run = Run(cfg, rt, plan.dataset, splits, model, forward, optimizers, scaler, Progress(), lengths, base)
    if plan.resume is not None:  # optimizer and scaler state, progress and random generators (state.pt)
        where = plan.resume.folder / STATE
        run.progress = plan.resume.train_state().restore(model, optimizers, scaler, where)
    run.tuner = rt.thread_tuner(start=run.progress.threads)
    return run


def build_model(plan: Plan) -> GPT:
    """The network with its starting weights, whole (before FSDP shards it): the resumed checkpoint's, else
    train.init_from's, else initialised. With LoRA, the base's weights and adapters (A drawn at random, B
    zero; a resumed run's from its checkpoint) on the projections lora.targets names."""
    cfg, resume, pretrained = plan.cfg, plan.resume, plan.pretrained
    weights, where = None, None  # read (their shapes checked) before any model is built
    if resume is not None and cfg.lora is None:
        weights, where = resume.weights(), resume.folder
    elif pretrained is not None:  # a fresh run's init_from, or a LoRA run's base
        weights, where = pretrained.weights_for(cfg.model), pretrained.where
    model = GPT(cfg.model).to(plan.rt.device)
    model.activation_checkpointing = cfg.train.activation_checkpointing
    if weights is not None:
        load_into(model, weights, where)
    if cfg.lora is not None:
        add_lora(model, cfg.lora)
        if resume is not None:
            load_into(model, resume.adapters()[0], resume.folder, adapters=True)
    return model


def save_checkpoint(run: Run, improved: bool) -> Path:
    """Write OUT_DIR/last with everything needed to resume, and copy it to OUT_DIR/best when `improved`."""
    # every rank helps gather (FSDP), the weights first: it leaves the parameters resharded, which gathering
    # the optimizer state needs (torch's get_state_dict orders them so too); rank 0 writes
    weights = checkpoint.model_weights(run.model)
    run.progress.threads = run.tuner.count if run.tuner.enabled else 0
    state = TrainState.capture(run.progress, run.cfg.tokens_per_iter, run.model, run.optimizers, run.scaler)
    if run.rt.is_main:
        tokenizer_meta, base = run.dataset.meta.tokenizer_meta, run.lora_base
        checkpoint.write_checkpoint(run.out_dir, "last", weights, run.cfg, tokenizer_meta, state, base)
        if improved:
            checkpoint.copy_checkpoint(run.out_dir, "last", "best")
    distributed.barrier(run.rt)
    return run.out_dir / "last"


def train_step(run: Run, it: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One iteration at the learning rates already set: (mean loss, gradient norm, finite), 0-d tensors on the
    device, none read back. `finite` is false when the step counts against train.skip_nonfinite: its loss
    or gradient was not finite (fp16: its loss; overflowing gradients are the loss scaler's business). A step
    whose loss or gradient is not finite is not applied, on every rank alike."""
    cfg, rt, scaler = run.cfg, run.rt, run.scaler
    loss_sum = torch.zeros((), device=rt.device)
    for micro in range(run.micro_steps):
        # micro-batch keys number the global sequence of micro-batches: the same data for any world size
        key = it * cfg.train.grad_accum + micro * rt.world_size + rt.rank
        x, y = run.splits["train"].batch(key, cfg.train.batch_size)
        with distributed.sync_gradients(run.forward, micro == run.micro_steps - 1, rt), rt.autocast():
            loss = run.forward(x, y)[1] / run.micro_steps  # logits not kept: freed before backward
        scaler.scale(loss).backward()
        loss_sum += loss.detach()
    for opt in run.optimizers:
        scaler.unscale_(opt)
    grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), cfg.optim.grad_clip or math.inf)
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: a DTensor
    loss_finite = distributed.on_every_rank(torch.isfinite(loss_sum), rt)  # gradients are the same on all
    apply = loss_finite & torch.isfinite(grad_norm)
    for opt in run.optimizers:
        step_unless(opt, ~apply)
    scaler.update()  # every step: fp16 lowers its scale after non-finite gradients, and unscale_ needs it
    for opt in run.optimizers:
        opt.zero_grad(set_to_none=True)
    return loss_sum, grad_norm, loss_finite if scaler.is_enabled() else apply


@torch.no_grad()
def estimate_loss(run: Run) -> dict[str, float]:
    """Mean loss over the same train.eval_iters batches of each split at every eval, shared across ranks:
    {"train": loss, "val": loss, "train_bpb": bits per byte, "val_bpb": ...} (bpb: where byte_lengths is
    known). Every rank runs the same number of forward passes (under FSDP each is a collective): where
    eval_iters is not a multiple of the number of ranks, the ranks short of a batch run one more that counts
    for nothing."""
    cfg, rt = run.cfg, run.rt
    run.forward.eval()
    out, tuner = {}, rt.thread_tuner()
    per_rank = -(-cfg.train.eval_iters // rt.world_size)
    for name, data in run.splits.items():
        total = torch.zeros(3, device=rt.device)  # sum of batch losses, batches, sum of bytes per token
        for key in range(rt.rank, per_rank * rt.world_size, rt.world_size):
            x, y = data.batch(key, cfg.train.batch_size, stream=1)
            with tuner.timed(), rt.autocast():
                _, loss = run.forward(x, y)
            if key < cfg.train.eval_iters:  # past it, a forward only keeps FSDP's collectives in step
                one = torch.ones((), device=rt.device)
                n_bytes = run.byte_lengths[y].sum().float() if run.byte_lengths is not None else 0 * one
                total += torch.stack([loss.float(), one, n_bytes / y.numel()])
        loss_sum, count, bytes_per_token = distributed.all_sum(total, rt).tolist()
        out[name] = loss_sum / count
        if bytes_per_token:  # every batch has the same number of tokens
            out[f"{name}_bpb"] = bits_per_byte(loss_sum, bytes_per_token)
    run.forward.train()
    return out
