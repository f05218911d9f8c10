"""Where and how a run computes: device, precision, threads, the memory a CPU step keeps, and this
process's torchrun rank; chosen here alone (training through `setup`, the dry run through
`planned`). Under torchrun, the Runtime also holds the process group and the collectives that keep
the ranks in step (DDP or FSDP2); with one process each is a no-op or a plain call, so the training
code reads the same.

`auto` picks CUDA (cuda:LOCAL_RANK under torchrun), else Apple MPS, else the CPU; bf16 autocast on
GPUs with bf16 tensor cores, fp16 with a GradScaler on older ones, fp32 on MPS, and on a CPU bf16
only where bf16 matrix units pay for the casts (`cpu_auto_precision`).

A dataset is prepared before the process group starts (training/plan.py), so no collective's timeout
has to outlast it. A rank that stops, hangs or dies becomes an error on the others within
`train.dist_timeout`, one line naming the collective and our caller (training/torchrun.py's
`hang_error`).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import functools
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist

from common.errors import UserError
from common.threads import ThreadTuner


@dataclass
class Runtime:
    device: torch.device
    precision: str  # fp32 | bf16 | fp16
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1  # processes on this machine
    threads: int = 0  # train.threads: the CPU threads the user chose (0: chosen by timing the work)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def autocast_dtype(self) -> Optional[torch.dtype]:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)

    def autocast(self):
        """Context for forward passes: autocast to the training precision (nothing in fp32)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def thread_tuner(self, **kwargs) -> ThreadTuner:
        """A tuner of the CPU thread count for one loop (common/threads.py): off the CPU, under
        torchrun (the ranks wait for each other, so one rank's steps do not time its threads) and
        with train.threads set, a no-op."""
        tuned = self.device.type == "cpu" and not self.distributed and not self.threads
        return ThreadTuner(enabled=tuned, **kwargs)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()

    # --- torchrun's process group and its collectives: with one process, no-ops or plain calls ---

    def join(self, timeout_minutes: float) -> None:
        """Join torchrun's process group (NCCL on CUDA, else gloo); every collective then fails
        after waiting `timeout_minutes` instead of hanging. Under torchrun, stop with the launcher
        (`_follow_launcher`)."""
        if os.environ.get("TORCHELASTIC_RUN_ID"):
            _follow_launcher()
        if self.distributed and not dist.is_initialized():
            dist.init_process_group(
                backend="nccl" if self.device.type == "cuda" else "gloo",
                timeout=datetime.timedelta(minutes=timeout_minutes),
            )

    def shutdown(self) -> None:
        """Leave the process group."""
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        if self.distributed:
            dist.barrier()

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over all ranks (a new tensor: `t` is left as it is)."""
        if self.distributed:
            t = t.clone()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def agree(self, values: list[float]) -> list[float]:
        """The largest of each value over all ranks (one small all-reduce), so that every rank
        takes the same decisions: stop on a signal any rank received, follow the slowest rank's
        clock."""
        if not self.distributed:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def on_every_rank(self, flag: torch.Tensor) -> torch.Tensor:
        """A boolean tensor, true where it is true on every rank; stays on the device (nothing
        read back)."""
        if not self.distributed:
            return flag
        t = flag.float()
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return t.bool()

    def all_finite(self, tensors) -> bool:
        """Whether every tensor (parameters, FSDP shards too) is finite, on every rank (one
        read-back)."""
        local = [w.to_local() if hasattr(w, "to_local") else w for w in tensors]
        flag = torch.stack([w.detach().isfinite().all() for w in local]).all()
        return bool(self.on_every_rank(flag).item())

    def sync_gradients(self, forward: torch.nn.Module, sync: bool):
        """Context for one micro-step's forward and backward through `forward` (what
        training/torchrun.py's `wrap` returned, compiled or not): all-reduce the gradients only
        when `sync`."""
        model = getattr(forward, "_orig_mod", forward)  # compiled: the module torch.compile wraps
        if not self.distributed or sync:
            if self.distributed and hasattr(model, "set_requires_gradient_sync"):
                model.set_requires_gradient_sync(True)
            return contextlib.nullcontext()
        if hasattr(model, "no_sync"):  # DDP
            return model.no_sync()
        model.set_requires_gradient_sync(False)  # FSDP2
        return contextlib.nullcontext()


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


def pick_device(setting: str, local_rank: int = 0) -> torch.device:
    cuda = torch.cuda.is_available()
    mps = torch.backends.mps.is_available()
    if setting == "cuda" and not cuda:
        raise UserError(
            "train.device=cuda but no CUDA GPU is visible to PyTorch (is the CUDA build of torch "
            "installed?); use train.device=auto or cpu"
        )
    if setting == "mps" and not mps:
        raise UserError(
            "train.device=mps but Apple MPS is not available; use train.device=auto or cpu"
        )
    if setting == "cuda" or (setting == "auto" and cuda):
        return torch.device("cuda", local_rank)
    if setting == "mps" or (setting == "auto" and mps):
        return torch.device("mps")
    return torch.device("cpu")


@functools.cache
def cpu_has_bf16_matmul() -> bool:
    """True on CPUs with bf16 matrix instructions (Intel AMX, AVX512-BF16) that torch's kernels may
    use: ATEN_CPU_CAPABILITY=avx2 (an AVX2-only CPU emulated on a newer one) gives them up."""
    if torch.backends.cpu.get_cpu_capability() in ("DEFAULT", "AVX2"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


def cpu_auto_precision(n_embd: int) -> str:
    """bf16 on a CPU with bf16 matrix units once the model is wide enough that the faster matrix
    products clearly outweigh the casts autocast adds around them; fp32 below that (BENCHMARKS.md,
    "bf16 autocast: where it pays")."""
    return "bf16" if cpu_has_bf16_matmul() and n_embd >= CPU_BF16_MIN_WIDTH else "fp32"


# the narrowest model where bf16 gained more than the noise (the section above)
CPU_BF16_MIN_WIDTH = 128


def pick_precision(setting: str, device: torch.device, n_embd: int) -> str:
    if setting != "auto":
        if (
            setting == "bf16"
            and device.type == "cuda"
            and not torch.cuda.is_bf16_supported(including_emulation=True)
        ):
            raise UserError(
                "train.precision=bf16 but this GPU has no bf16 support; use fp16 or auto"
            )
        if setting == "fp16" and device.type == "cpu":
            raise UserError("train.precision=fp16 is for GPUs; on a CPU use bf16 or fp32")
        return setting
    # native bf16 only: torch counts emulated bf16 as supported by default
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"
    if device.type == "cpu":
        return cpu_auto_precision(n_embd)
    return "fp32"


def planned(
    device_setting: str, precision_setting: str, n_embd: int, threads: int = 0
) -> tuple[Runtime, bool]:
    """(runtime, present): the dry run's. Where the device is here, `setup`'s (taken: the dry run
    times steps on it). A CUDA or MPS setting on a machine without one is absent (present False),
    with the precision such a device would get: auto on CUDA is bf16, as on every GPU the dry run
    projects to."""
    there = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    if not there.get(device_setting, True):
        auto = "bf16" if device_setting == "cuda" else "fp32"
        precision = auto if precision_setting == "auto" else precision_setting
        return Runtime(torch.device(device_setting), precision), False
    return setup(device_setting, precision_setting, n_embd, threads), True


class Ranks(NamedTuple):
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int  # processes on this machine


def torchrun_ranks() -> Ranks:
    """This process's rank under torchrun, read from its environment (rank 0 of 1 without it)."""
    env = os.environ
    rank, world = int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1))
    return Ranks(
        rank, int(env.get("LOCAL_RANK", rank)), world, int(env.get("LOCAL_WORLD_SIZE", world))
    )


def setup(device_setting: str, precision_setting: str, n_embd: int, threads: int = 0) -> Runtime:
    """This process's rank under torchrun (`torchrun_ranks`), its device and precision."""
    rank, local_rank, world, local_world = torchrun_ranks()
    device = pick_device(device_setting, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if threads:  # the user's count: this runtime's tuners leave it
        torch.set_num_threads(threads)
    if device.type == "cpu":
        keep_freed_memory()
    precision = pick_precision(precision_setting, device, n_embd)
    return Runtime(device, precision, rank, local_rank, world, local_world, threads)


def keep_freed_memory() -> None:
    """Keep the memory a CPU step frees for the next step, instead of glibc's default: it hands
    large blocks back to the system, and each page taken again is zeroed at its first touch
    (2,400-3,500 page faults a step at the default config, a tenth of its time: BENCHMARKS.md,
    "Memory a step keeps"), as jemalloc or tcmalloc would. Linux with glibc only;
    a user's own malloc settings (MALLOC_*, GLIBC_TUNABLES) are kept."""
    tuned = any(k.startswith(("MALLOC_", "GLIBC_TUNABLES")) for k in os.environ)
    if sys.platform != "linux" or tuned:
        return
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # another C library (musl)
        return
    mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: blocks under 32 MiB from the heap (glibc's largest)
    mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: the heap's free top kept up to 1 GiB
