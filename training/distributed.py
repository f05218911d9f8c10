"""Data-parallel training under torchrun: DDP or FSDP2, and the reductions that keep ranks in step.
With one process every function here is a no-op or a plain call, so the training code reads the
same.

A dataset is prepared before the process group starts (`once_per_machine`), so no collective's
timeout has to outlast it. A rank that stops, hangs or dies becomes an error on the others within
`train.dist_timeout`, one line naming the collective and our caller (`explain_hangs`).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import signal
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist


def join(rt, timeout_minutes: float) -> None:
    """Join torchrun's process group (NCCL on CUDA, else gloo); every collective then fails after
    waiting `timeout_minutes` instead of hanging. Under torchrun, stop with the launcher
    (`_follow_launcher`)."""
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        _follow_launcher()
    if rt.distributed and not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if rt.device.type == "cuda" else "gloo",
            timeout=datetime.timedelta(minutes=timeout_minutes),
        )


def _follow_launcher() -> None:
    """When the torchrun that started this process dies without stopping it (kill -9, an OOM kill),
    send this process SIGTERM, as torchrun itself would have: the run stops at its next log step
    with a checkpoint (training/run.py), on every rank, instead of training on as an orphan nobody
    can stop."""
    launcher = os.getppid()

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="follow-launcher", daemon=True).start()


def barrier(rt) -> None:
    if rt.distributed:
        dist.barrier()


def all_sum(t: torch.Tensor, rt) -> torch.Tensor:
    if rt.distributed:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def agree(values: list[float], rt) -> list[float]:
    """The largest of each value over all ranks (one small all-reduce), so that every rank takes the
    same decisions: stop on a signal any rank received, follow the slowest rank's clock."""
    if not rt.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=rt.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def on_every_rank(flag: torch.Tensor, rt) -> torch.Tensor:
    """A boolean tensor, true where it is true on every rank; stays on the device (nothing read
    back)."""
    if not rt.distributed:
        return flag
    t = flag.float()
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return t.bool()


def all_finite(tensors, rt) -> bool:
    """Whether every tensor (parameters, FSDP shards too) is finite, on every rank (one
    read-back)."""
    local = [w.to_local() if hasattr(w, "to_local") else w for w in tensors]
    flag = torch.stack([w.detach().isfinite().all() for w in local]).all()
    return bool(on_every_rank(flag, rt).item())


def explain_hangs(main: Callable) -> Callable:
    """Wrap a script's main: a collective that timed out, or whose peer went away (a rank's process
    or its machine killed), becomes a UserError naming it (training/torchrun.py's `hang_error`)."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except RuntimeError as e:
            from training.torchrun import hang_error  # a failed collective only

            error = hang_error(e)
            if error is None:
                raise
            raise error from None

    return wrapped


def shutdown(rt) -> None:
    if rt.distributed and dist.is_initialized():
        dist.destroy_process_group()


def sync_gradients(forward: torch.nn.Module, sync: bool, rt):
    """Context for one micro-step's forward and backward through `forward` (what `wrap` returned,
    compiled or not): all-reduce gradients only when `sync`."""
    model = getattr(forward, "_orig_mod", forward)  # under torch.compile: the module it compiled
    if not rt.distributed or sync:
        if rt.distributed and hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(True)
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    model.set_requires_gradient_sync(False)  # FSDP2
    return contextlib.nullcontext()
