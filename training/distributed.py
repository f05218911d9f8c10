"""Data-parallel training under torchrun: DDP or FSDP2, and the reductions that keep ranks in step.

With one process every function here is a no-op or a plain call, so the training code reads the
same.
- `once_per_machine`: work before the process group starts (preparing a dataset), by local rank 0
  while the machine's other ranks wait on its files, not in a collective whose timeout the work
  could outlast.
- `join`: the process group with a timeout (`train.dist_timeout`): a rank that stops or hangs
  becomes an error on the others, and so does one whose process or machine dies (at once: its
  connections close); `explain_hangs` turns that error into one line naming the collective and our
  caller. A rank whose torchrun is killed stops the run as torchrun's SIGTERM would, with a
  checkpoint.
- `wrap`: DDP replicates the model; FSDP2 (fully_shard) shards each block (bf16 gathers, fp32
  reductions).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from common.errors import UserError

# the project's folder, to find our frames in a traceback
ROOT = Path(__file__).resolve().parent.parent
HEARTBEAT_S, GIVE_UP_S = 10.0, 120.0  # once_per_machine: local rank 0 touches its file this often


def once_per_machine(rt, ready: Path, work: Callable[[], object], what: str, beat: Path) -> None:
    """Unless file `ready` exists: local rank 0 runs `work` (which creates `ready`), the other local
    ranks wait for the file. Meanwhile local rank 0 touches file `beat` every 10 s; a waiting rank
    gives up with one line when it has seen no sign of it for 2 minutes (local rank 0 failed or
    died: torchrun would have stopped the others already, other launchers may not)."""
    if ready.is_file():
        return
    if rt.local_rank == 0:
        beat.parent.mkdir(parents=True, exist_ok=True)
        done = threading.Event()
        beating = threading.Thread(target=_heartbeat, args=(beat, done), daemon=True)
        beating.start()
        try:
            work()
        finally:
            done.set()
            beating.join()
            beat.unlink(missing_ok=True)
        return
    last_sign = time.time()
    while not ready.is_file():
        with contextlib.suppress(OSError):
            last_sign = max(last_sign, beat.stat().st_mtime)
        if time.time() - last_sign > GIVE_UP_S:
            raise UserError(
                f"rank {rt.rank} waited for local rank 0 to prepare {what}, but it has shown no "
                f"sign of work for {GIVE_UP_S:.0f} s (see its error); prepare it first, then start "
                "again"
            )
        time.sleep(0.2)


def _heartbeat(path: Path, done: threading.Event) -> None:
    while True:
        path.touch()
        if done.wait(HEARTBEAT_S):
            return


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


# what gloo and NCCL say when the rank at the other end of a connection is gone (its process or its
# machine)
PEER_GONE = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "remote process exited",
)


def all_finite(tensors, rt) -> bool:
    """Whether every tensor (parameters, FSDP shards too) is finite, on every rank (one
    read-back)."""
    local = [w.to_local() if hasattr(w, "to_local") else w for w in tensors]
    flag = torch.stack([w.detach().isfinite().all() for w in local]).all()
    return bool(on_every_rank(flag, rt).item())


def explain_hangs(main: Callable) -> Callable:
    """Wrap a script's main: a collective that timed out, or whose peer went away (a rank's process
    or its machine killed), becomes a UserError naming it (gloo raises a RuntimeError in the waiting
    rank; NCCL's watchdog reports the collective itself and ends the process)."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except RuntimeError as e:
            found = _failed_collective(e)
            if found is None:
                raise
            where, gone = found
            rank = os.environ.get("RANK", "0")
            if gone:
                raise UserError(
                    f"rank {rank} lost another rank in {where}: its process or its machine went "
                    "away (see its output); run again with train.resume=true to continue from the "
                    "last checkpoint"
                ) from None
            raise UserError(
                f"rank {rank} waited longer than train.dist_timeout in {where}: another rank "
                "stopped, died or is stuck (see its output); raise train.dist_timeout if that "
                "rank is only slow, or set TORCH_DISTRIBUTED_DEBUG=DETAIL to see more"
            ) from None

    return wrapped


def _failed_collective(e: RuntimeError) -> tuple[str, bool] | None:
    """For a collective that timed out or lost its peer: ('all_reduce (called from training/run.py
    in evaluate)', whether the peer is gone): the collective (else the torch.distributed function
    entered) and the code of ours that led there. DDP's gradient all-reduce runs in autograd's
    hooks, so a rank stalled in backward fails in backward()."""
    frames = traceback.extract_tb(e.__traceback__)
    torch_dirs = (f"torch{os.sep}distributed{os.sep}", f"torch{os.sep}autograd{os.sep}")
    entered = [i for i, f in enumerate(frames) if any(d in f.filename for d in torch_dirs)]
    text = str(e).lower()
    gone = any(words in text for words in PEER_GONE)
    if not (gone or "timed out" in text) or not entered:
        return None
    c10d = [frames[i].name for i in entered if frames[i].filename.endswith("distributed_c10d.py")]
    autograd = torch_dirs[1] in frames[entered[0]].filename
    name = (
        c10d[-1]
        if c10d
        else "backward (the gradient all-reduce)"
        if autograd
        else frames[entered[0]].name
    )
    ours = [f for f in frames[: entered[0]] if _ours(f.filename) and f.filename != __file__]
    if not ours:
        return name, gone
    where = Path(ours[-1].filename).resolve().relative_to(ROOT)
    return f"{name} (called from {where}:{ours[-1].lineno} in {ours[-1].name})", gone


def _ours(filename: str) -> bool:
    """A file of this project's code: under its root, but not in a virtual environment kept there
    (.venv)."""
    path = Path(filename).resolve()
    return path.is_relative_to(ROOT) and "site-packages" not in path.parts


def shutdown(rt) -> None:
    if rt.distributed and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, cfg, rt) -> torch.nn.Module:
    """The module this process runs forward passes through: the model itself (FSDP shards it in
    place), or its DDP wrapper."""
    if not rt.distributed:
        return model
    if cfg.train.parallel == "fsdp":
        try:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        except ImportError:
            raise UserError(
                f"train.parallel=fsdp needs torch >= 2.6 (this is {torch.__version__})"
            ) from None
        # bf16: gather bf16 weights for the forward and backward (half the all-gather traffic, and
        # the matrix products autocast would cast them for anyway), reduce-scatter gradients in
        # fp32; the sharded weights and optimizer state stay fp32
        policy = MixedPrecisionPolicy()
        if rt.precision == "bf16":
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [rt.local_rank] if rt.device.type == "cuda" else None
    return DDP(model, device_ids=ids)


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
