"""What only a torchrun job needs: a dataset prepared once per machine before the process group
starts, the model wrapped for DDP or sharded by FSDP2, and a collective that failed explained in one
line. A run of one process never imports this module (runs/runtime.py's collectives are no-ops
there).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from common.errors import UserError

# the project's folder, to find our frames in a traceback
ROOT = Path(__file__).resolve().parent.parent
# once_per_machine: local rank 0 touches its file this often
HEARTBEAT_S = 10.0
GIVE_UP_S = 120.0


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


def wrap(model: torch.nn.Module, cfg, rt) -> torch.nn.Module:
    """The module a torchrun rank runs forward passes through: the model itself (FSDP shards it in
    place), or its DDP wrapper."""
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


def hang_error(e: RuntimeError) -> UserError | None:
    """The one line for a collective that timed out or lost its peer (gloo raises a RuntimeError in
    the waiting rank; NCCL's watchdog reports the collective itself and ends the process); None for
    any other error."""
    found = _failed_collective(e)
    if found is None:
        return None
    where, gone = found
    rank = os.environ.get("RANK", "0")
    if gone:
        return UserError(
            f"rank {rank} lost another rank in {where}: its process or its machine went away (see "
            "its output); run again with train.resume=true to continue from the last checkpoint"
        )
    return UserError(
        f"rank {rank} waited longer than train.dist_timeout in {where}: another rank stopped, died "
        "or is stuck (see its output); raise train.dist_timeout if that rank is only slow, or set "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL to see more"
    )


# what gloo and NCCL say when the rank at the other end of a connection is gone (its process or its
# machine)
PEER_GONE = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "remote process exited",
)


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
    ours = [f for f in frames[: entered[0]] if _ours(f.filename) and not _explaining(f.filename)]
    if not ours:
        return name, gone
    where = Path(ours[-1].filename).resolve().relative_to(ROOT)
    return f"{name} (called from {where}:{ours[-1].lineno} in {ours[-1].name})", gone


def _explaining(filename: str) -> bool:
    """A frame between our caller and torch: a collective of runs/runtime.py's Runtime, or this
    module's (DDP's wrapping)."""
    return Path(filename).resolve() in (Path(__file__).resolve(), ROOT / "runs" / "runtime.py")


def _ours(filename: str) -> bool:
    """A file of this project's code: under its root, but not in a virtual environment kept there
    (.venv)."""
    path = Path(filename).resolve()
    return path.is_relative_to(ROOT) and "site-packages" not in path.parts
