"""The parts of training that train.py and bench.py share: building a run and taking one optimizer step.

`build` turns a resolved config into a `Run`: dataset windows, the model (wrapped for DDP/FSDP, compiled when
asked), its optimisers and, for fp16, a GradScaler. `train_step` runs one iteration: the micro-batches of
this process (gradients all-reduced on the last one only), gradient clipping, and the optimizer step, which
is skipped when the loss or the gradient is not finite. `evaluate` measures the loss on fixed batches.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch

from common.errors import UserError
from data.loader import TokenWindows
from data.prepare import DATA_DIR, ensure_prepared, load_meta
from model import GPT, GPTConfig
from training import checkpoint, distributed
from training.config import Config
from training.optim import make_optimizers
from training.runtime import Runtime, compile_enabled


@dataclass
class Run:
    cfg: Config
    rt: Runtime
    meta: dict  # the dataset's meta.json
    splits: dict[str, TokenWindows]
    raw_model: GPT  # the model itself (sharded in place under FSDP)
    model: torch.nn.Module  # what gradients sync through: raw_model, or its DDP wrapper
    step_model: torch.nn.Module  # what forward passes run: model, or torch.compile(model)
    optimizers: list[torch.optim.Optimizer]
    scaler: Optional[torch.amp.GradScaler]

    @property
    def micro_steps(self) -> int:
        return self.cfg.train.grad_accum // self.rt.world_size

    @property
    def tokens_per_iter(self) -> int:
        return self.cfg.train.batch_size * self.cfg.model.block_size * self.cfg.train.grad_accum


def model_config(cfg: Config, meta: dict) -> GPTConfig:
    mc = GPTConfig(**asdict(cfg.model))
    if mc.vocab_size is None:
        mc.vocab_size = meta["vocab_size"]
    elif mc.vocab_size < meta["vocab_size"]:
        raise UserError(
            f"model.vocab_size={mc.vocab_size} is smaller than the dataset's vocabulary "
            f"({meta['vocab_size']}); remove it to use the dataset's"
        )
    return mc


def load_dataset(cfg: Config, rt: Runtime) -> tuple[dict, dict[str, TokenWindows]]:
    """The dataset's metadata and split windows (rank 0 prepares a known dataset on first use).
    Fills in cfg.model.vocab_size from the dataset when the config leaves it null."""
    if cfg.train.grad_accum % rt.world_size:
        raise UserError(
            f"train.grad_accum={cfg.train.grad_accum} (micro-batches per step, over all processes) "
            f"must be a multiple of the {rt.world_size} processes"
        )
    data_dir = Path(cfg.data.dir) if cfg.data.dir else DATA_DIR
    if rt.is_main:
        ensure_prepared(cfg.data.dataset, data_dir)
    distributed.barrier(rt)
    meta = load_meta(data_dir / cfg.data.dataset)
    cfg.model = model_config(cfg, meta)
    splits = {
        s: TokenWindows(
            data_dir / cfg.data.dataset / f"{s}.bin",
            meta["dtype"],
            cfg.model.block_size,
            rt.device,
            cfg.train.seed,
            s,
        )
        for s in ("train", "val")
    }
    return meta, splits


def build(
    cfg: Config, rt: Runtime, meta: dict, splits: dict[str, TokenWindows], weights_from: Optional[Path] = None
) -> Run:
    """The model (seeded init, or the weights of checkpoint `weights_from`), wrapped, compiled, optimised."""
    torch.manual_seed(cfg.train.seed)
    raw = GPT(cfg.model).to(rt.device)
    if weights_from is not None:
        distributed.load_weights(raw, weights_from, rt)
    model, raw = distributed.wrap(raw, cfg, rt)
    optimizers = make_optimizers(raw, cfg.optim, rt.device)
    scaler = torch.amp.GradScaler(rt.device.type) if rt.precision == "fp16" else None
    compiled = compile_enabled(cfg.train.compile, rt.device)
    step_model = torch.compile(model, mode=cfg.train.compile_mode) if compiled else model
    return Run(cfg, rt, meta, splits, raw, model, step_model, optimizers, scaler)


def train_step(run: Run, it: int) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """One iteration at the learning rates already set: (mean loss, gradient norm) as tensors on the device,
    and whether the step was applied (False when the loss or the gradient was not finite)."""
    cfg, rt = run.cfg, run.rt
    loss_sum = torch.zeros((), device=rt.device)
    for micro in range(run.micro_steps):
        # micro-batch keys number the global sequence of micro-batches: the same data for any world size
        x, y = run.splits["train"].batch(
            it * cfg.train.grad_accum + micro * rt.world_size + rt.rank, cfg.train.batch_size
        )
        with distributed.sync_gradients(run.model, micro == run.micro_steps - 1, rt), rt.autocast():
            _, loss = run.step_model(x, y)
            loss = loss / run.micro_steps
        (run.scaler.scale(loss) if run.scaler is not None else loss).backward()
        loss_sum += loss.detach()
    if run.scaler is not None:
        for opt in run.optimizers:
            run.scaler.unscale_(opt)
    grad_norm = torch.nn.utils.clip_grad_norm_(
        run.raw_model.parameters(), cfg.optim.grad_clip or float("inf")
    )
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: a DTensor
    # fp16: inf gradients are the GradScaler's business (it skips those steps and lowers the scale)
    finite = torch.isfinite(loss_sum) & (torch.isfinite(grad_norm) if run.scaler is None else True)
    applied = distributed.all_true(finite, rt)
    if applied:
        for opt in run.optimizers:
            run.scaler.step(opt) if run.scaler is not None else opt.step()
        if run.scaler is not None:
            run.scaler.update()
    for opt in run.optimizers:
        opt.zero_grad(set_to_none=True)
    return loss_sum, grad_norm, applied


@torch.no_grad()
def evaluate(run: Run) -> dict[str, float]:
    """Mean loss over the same train.eval_iters batches of each split at every eval, shared across ranks."""
    cfg, rt = run.cfg, run.rt
    run.step_model.eval()
    out = {}
    for name, data in run.splits.items():
        total = torch.zeros(2, device=rt.device)
        for key in range(rt.rank, cfg.train.eval_iters, rt.world_size):
            x, y = data.batch(key, cfg.train.batch_size, stream=1)
            with rt.autocast():
                _, loss = run.step_model(x, y)
            total += torch.stack([loss.float(), torch.ones((), device=rt.device)])
        loss_sum, count = distributed.all_sum(total, rt).tolist()
        out[name] = loss_sum / count
    run.step_model.train()
    return out


def check_compatible(ckpt: Path, saved: Config, cfg: Config, tokenizer_meta: dict) -> None:
    """Refuse to resume from a checkpoint of another shape or tokenizer, naming the field that differs."""
    for field, theirs in asdict(saved.model).items():
        ours = getattr(cfg.model, field)
        if theirs != ours and field != "dropout":
            raise UserError(
                f"checkpoint {ckpt} has model.{field}={theirs} but the config says {ours}; resume "
                "with the config it was trained with, or start a new run in another train.out_dir"
            )
    theirs = checkpoint.load_tokenizer_meta(ckpt)
    if theirs != tokenizer_meta:
        diff = next(
            k for k in sorted(set(theirs) | set(tokenizer_meta)) if theirs.get(k) != tokenizer_meta.get(k)
        )
        raise UserError(
            f"checkpoint {ckpt} was trained with another tokenizer (its {diff} differs from the "
            "dataset's); resume on the dataset it was trained on"
        )
