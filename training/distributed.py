"""Data-parallel training under torchrun: DDP or FSDP2, and the reductions that keep ranks in step.

With one process every function here is a no-op or a plain call, so train.py reads the same either way.
- `wrap`: DDP (`train.parallel: ddp`) replicates the model; FSDP2 (`fsdp`, torch.distributed.fsdp.fully_shard)
  shards each block's parameters, gradients and optimizer state across ranks.
- `sync_gradients`: gradients are all-reduced only on the last micro-step of an iteration (DDP no_sync /
  FSDP set_requires_gradient_sync on the others).
- `explain_hangs`: a collective that waited longer than `train.dist_timeout` (a rank stopped, died or took
  another path) becomes one error line naming the collective and where it was called, not a traceback.
Checkpoints of every kind of run are written and read by training/checkpoint.py.
"""

from __future__ import annotations

import contextlib
import functools
import os
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from common.errors import UserError


def barrier(rt) -> None:
    if rt.distributed:
        dist.barrier()


def all_sum(t: torch.Tensor, rt) -> torch.Tensor:
    if rt.distributed:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def agree(values: list[float], rt) -> list[float]:
    """The largest of each value over all ranks (one small all-reduce), so that every rank takes the same
    decisions: stop on a signal any rank received, follow the slowest rank's clock."""
    if not rt.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=rt.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def all_true(t: torch.Tensor, rt) -> bool:
    if not rt.distributed:
        return bool(t)
    t = t.float().reshape(1)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def explain_hangs(main: Callable) -> Callable:
    """Wrap a script's main: a collective that timed out becomes a UserError naming it (gloo raises a
    RuntimeError in the waiting rank; NCCL's watchdog reports the collective itself and ends the process)."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except RuntimeError as e:
            where = _timed_out_collective(e)
            if where is None:
                raise
            raise UserError(
                f"rank {os.environ.get('RANK', '0')} waited longer than train.dist_timeout in {where}: "
                "another rank stopped, died or is stuck (see its output); raise train.dist_timeout if that "
                "rank is only slow, or set TORCH_DISTRIBUTED_DEBUG=DETAIL to see more"
            ) from None

    return wrapped


def _timed_out_collective(e: RuntimeError) -> str | None:
    """For a collective's timeout, 'all_reduce (called from training/trainer.py:201 in evaluate)'; else
    None."""
    frames = traceback.extract_tb(e.__traceback__)
    names = [f.name for f in frames if f.filename.endswith("distributed_c10d.py")]
    if "timed out" not in str(e).lower() or not names:
        return None
    root = Path(__file__).resolve().parent.parent
    ours = [f for f in frames if Path(f.filename).resolve().is_relative_to(root) and f.filename != __file__]
    if not ours:
        return names[-1]
    caller = ours[-1]
    file = Path(caller.filename).resolve().relative_to(root)
    return f"{names[-1]} (called from {file}:{caller.lineno} in {caller.name})"


def shutdown(rt) -> None:
    if rt.distributed and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, cfg, rt) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the module to run steps on, the underlying GPT) for this process."""
    if not rt.distributed:
        return model, model
    if cfg.train.parallel == "fsdp":
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            raise UserError(f"train.parallel=fsdp needs torch >= 2.6 (this is {torch.__version__})") from None
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model, model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [rt.local_rank] if rt.device.type == "cuda" else None
    return DDP(model, device_ids=ids), model


def sync_gradients(model: torch.nn.Module, sync: bool, rt):
    """Context for one micro-step's forward and backward: all-reduce gradients only when `sync`."""
    if not rt.distributed or sync:
        if rt.distributed and hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(True)
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    model.set_requires_gradient_sync(False)  # FSDP2
    return contextlib.nullcontext()
