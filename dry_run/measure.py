"""Measured, not predicted: the memory the first training steps add, and the time of real steps.

`measure_training_memory` runs in a fresh process (so nothing the caller allocated counts) and
reports the resident memory the first training steps add (Linux VmHWM after clear_refs), and how
much of it is PyTorch's own code paged in on first use (file-backed; not training memory).
tools.bench reports the first number; the tests compare the second against dry_run/memory.py's
prediction (with `final_eval`, of the steps and the exact val eval that ends a run). `time_steps`
times real steps and eval forwards of a run on this device, for the dry run: on a CPU through the
run's thread tuner, as training runs them.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from dataclasses import dataclass

import torch

from common.errors import UserError
from common.threads import FIRST_TRY
from runs.config import from_arguments
from training.plan import plan_run, run_dataset
from training.run import Run, exact_val_loss, start_run, train_step


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


# Linux: writing 5 resets the peak resident size (VmHWM) to the current
CLEAR_REFS = "/proc/self/clear_refs"


def _memory_probe(args: list[str], final_eval: bool = False) -> tuple[float, float] | None:
    """In a fresh process: (memory added by the first training steps, in MB; the part of it that is
    PyTorch's code paged in on first use); with `final_eval`, by them and the exact val eval that
    ends a run. CPU: resident memory, where Linux's /proc lets it be measured (else None: macOS,
    Windows, some sandboxes); MPS: what the Metal driver allocated."""
    request = from_arguments(args)
    run = start_run(plan_run(request, run_dataset(request)))
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
    if final_eval:
        exact_val_loss(run)
    peak, files_after = _status_mb(("VmHWM", "RssFile"))
    return peak - rss, files_after - files


def measure_training_memory(args: list[str]) -> tuple[float, float] | None:
    """`_memory_probe` of the run `CONFIG [section.key=value ...]` asks for, in a fresh process (so
    nothing this one allocated counts); None where it cannot."""
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(_memory_probe, (args,))


# the most time_steps waits for the thread tuner's first choice (a large model's slow steps)
WAIT_S = 60.0


@dataclass
class Timing:
    step_s: float  # one micro-batch forward + backward and one optimizer step, median
    forward_s: float  # one eval batch forward, median
    first_s: float  # the first step (optimizer state allocated; compiling, when on)
    steps: int  # timed
    # steps run before them: the first, and on a CPU those before the thread tuner's first choice
    after: int
    before_s: (
        # those steps' seconds, which a run spends too (the first and the stalls before the choice)
        float
    )
    threads: int  # the CPU threads they ran on (the thread tuner's count)
    # the first step train_step did not apply (its loss or gradient not finite), else None
    nonfinite: int | None = None


def _eval_forward_s(run: Run) -> float:
    """Seconds of one eval batch's forward (no gradients, eval mode), the median of 3 after one."""
    x, y = run.splits["val"].batch(0, run.cfg.train.batch_size, stream=1)
    times = []
    run.forward.eval()
    for _ in range(4):
        start = time.perf_counter()
        with torch.no_grad(), run.rt.autocast():
            run.forward(x, y)
        run.rt.synchronize()
        times.append(time.perf_counter() - start)
    run.forward.train()
    return statistics.median(times[1:])


def time_steps(run: Run, budget_s: float = 3.0, max_steps: int = 20) -> Timing:
    """Time real training steps of `run` (built with grad_accum 1) and eval forwards on this device.
    On a CPU the steps go through the run's thread tuner (common/threads.py) as training's do,
    numbered as training numbers them, and those timed are the ones after its first choice at the
    count it chose: what training runs beside a busy process, not the stalls before the choice.
    They run at the peak learning rate (optim.lr, no warmup), and are read back once at the end
    for a step training would not apply (`Timing.nonfinite`)."""
    rt = run.rt
    tuner = run.tuner
    results = []

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        rt.synchronize()
        return time.perf_counter() - start

    def step(it: int) -> float:
        with tuner.timed(it):
            return timed(lambda: results.append(train_step(run, it)))

    first = step(0)
    # the first try of another count is over
    chosen = FIRST_TRY + tuner.tries if tuner.enabled else 2
    it = 1
    waited = first
    times = []
    while len(times) < 3 or (sum(times) < budget_s and len(times) < max_steps):
        trying = tuner.trial is not None
        seconds = step(it)
        # not the tries: training seldom runs them
        if (it >= chosen or waited > WAIT_S) and not trying:
            times.append(seconds)
        else:
            waited += seconds
        it += 1
    threads = tuner.count if tuner.enabled else torch.get_num_threads()
    applied = torch.stack(results)[:, 2].tolist()  # train_step's [loss, gradient norm, counted]
    return Timing(
        statistics.median(times),
        _eval_forward_s(run),
        first,
        len(times),
        it - len(times),
        waited,
        threads,
        next((i for i, counted in enumerate(applied) if not counted), None),
    )
