"""tools.bench's training measurements: the real train step of each setup timed in alternate rounds
(quiet, and beside a busy process), its MFU and peak memory, and training's memory as the context
grows; and the table every measurement prints."""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from dataclasses import dataclass, field

import torch

from common.threads import busy_neighbour
from dry_run.hardware import peak_flops
from dry_run.measure import measure_training_memory
from runs.config import Config, from_arguments
from runs.runtime import Runtime
from training.plan import plan_run, run_dataset
from training.run import Run, start_run, train_step

CONTEXTS = (512, 1024, 2048, 4096)


@dataclass
class Setup:
    label: str
    args: list[str]  # CONFIG [section.key=value ...]
    run: Run = None
    threads: int = 0
    times: list[float] = field(default_factory=list)
    busy_times: list[float] = field(default_factory=list)  # --busy: steps beside a busy process
    it: int = 0
    held: int = 0  # CUDA bytes this setup keeps allocated (weights, optimizer state)
    peak_above: int = 0  # CUDA: the most allocated above that during its timed rounds

    @property
    def cfg(self) -> Config:
        return self.run.cfg

    @property
    def rt(self) -> Runtime:
        return self.run.rt


def build(args: list[str]) -> Run:
    request = from_arguments(args)
    return start_run(plan_run(request, run_dataset(request)))


def cuda_allocated() -> int:
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else 0


def build_setup(s: Setup, main_threads: int) -> None:
    start = cuda_allocated()
    s.run = build(s.args)
    s.held = cuda_allocated() - start
    s.threads = torch.get_num_threads()
    torch.set_num_threads(main_threads)


def timed_steps(s: Setup, n: int, record: bool, busy: bool = False) -> None:
    """n training steps of setup s, at the thread count its tuner picks as train.py's loop does
    (beside a busy process with `busy`); on CUDA, its memory: what the first (warm-up) steps leave
    allocated (optimizer state) is the setup's, and each timed round's peak is taken above what is
    allocated before it, so the other setup's weights never count."""
    torch.set_num_threads(s.threads)
    cuda = s.run.rt.device.type == "cuda"
    if cuda:
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    for _ in range(n):
        start = time.perf_counter()
        with s.run.tuner.timed(s.it):
            train_step(s.run, s.it)
            s.run.rt.synchronize()
        if record:
            (s.busy_times if busy else s.times).append(time.perf_counter() - start)
        s.it += 1
    if cuda and record:
        s.peak_above = max(s.peak_above, torch.cuda.max_memory_allocated() - before)
    elif cuda:
        s.held += torch.cuda.memory_allocated() - before


def train_result(s: Setup) -> dict:
    run = s.run
    rt = s.run.rt
    ms = statistics.median(s.times) * 1e3
    tok_s = run.cfg.tokens_per_iter / (ms / 1e3)
    flops = run.model.flops_per_token(run.cfg.model.block_size) * tok_s
    torch.set_num_threads(s.threads)
    peak = peak_flops(rt.device, rt.precision)
    if rt.device.type == "cuda":
        memory = (s.held + s.peak_above) / 2**20
    else:
        measured = measure_training_memory(s.args)
        memory = measured[0] if measured else None
    return {
        "setup": s.label,
        "params_M": round(run.model.num_params() / 1e6, 3),
        "tokens_per_iter": run.cfg.tokens_per_iter,
        "ms_per_iter": round(ms, 2),
        "tokens_per_s": round(tok_s),
        "mfu": round(flops / peak, 4) if peak else None,
        "peak_mem_MB": round(memory, 1) if memory is not None else None,  # None: not measured here
        "precision": rt.precision,
        "compile": run.compiled,
        "threads": s.threads,
        "device": str(rt.device),
        "steps_timed": len(s.times),
    } | busy_result(s.times, s.busy_times)


def busy_result(quiet: list[float], busy: list[float]) -> dict:
    """--busy: the median step (seconds each) beside the busy process, and its time over the quiet
    one's."""
    if not busy:
        return {}
    slower = statistics.median(busy) / statistics.median(quiet)
    return {"ms_busy": round(statistics.median(busy) * 1e3, 2), "busy_over_quiet": round(slower, 2)}


def train_section(args: argparse.Namespace, setups: list[Setup]) -> dict:
    """--only train: warm up, then time the setups' steps in alternate rounds, quiet and (--busy)
    beside a busy process; print the table; the results."""
    for s in setups:
        timed_steps(s, args.warmup, record=False)
    # alternate, so slow spells of a shared machine hit every setup
    for _ in range(args.rounds):
        for s in setups:
            timed_steps(s, args.steps, record=True)
    # the same again beside a busy process, once the tuners settled
    with busy_neighbour(args.busy):
        for s in setups if args.busy else []:
            timed_steps(s, 4 * args.warmup, record=False)
        for _ in range(args.rounds if args.busy else 0):
            for s in setups:
                timed_steps(s, args.steps, record=True, busy=True)
    results: dict = {"train": [train_result(s) for s in setups]}
    print(format_table(results["train"]))
    if len(setups) == 2:
        a, b = results["train"]
        ratio = round(b["tokens_per_s"] / a["tokens_per_s"], 3)
        results["ratio_B_over_A_tokens_per_s"] = ratio
        print(f"B / A training tokens/s: {ratio}")
    return results


def memory_scaling(s: Setup) -> list[dict]:
    rows = []
    for T in CONTEXTS:
        args = s.args + [f"model.block_size={T}", "train.batch_size=1", "train.grad_accum=1"]
        device = s.run.rt.device
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            run = build(args)
            base = torch.cuda.memory_allocated(device)
            for it in range(2):
                train_step(run, it)
            mb = (torch.cuda.max_memory_allocated(device) - base) / 2**20
            del run
        else:
            measured = measure_training_memory(args)
            mb = measured[0] if measured else None
        rows.append(
            {"setup": s.label, "context": T, "peak_train_mem_MB": round(mb, 1) if mb else None}
        )
    for a, b in itertools.pairwise(rows):
        if a["peak_train_mem_MB"] and b["peak_train_mem_MB"]:
            b["growth_vs_previous"] = round(b["peak_train_mem_MB"] / a["peak_train_mem_MB"], 2)
    return rows


def format_table(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    cells = [["n/a" if r.get(k, "") is None else str(r.get(k, "")) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = "  ".join(k.ljust(w) for k, w in zip(keys, widths))
    return "\n".join(
        [line, "-" * len(line)]
        + ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    )
