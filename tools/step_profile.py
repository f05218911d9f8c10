"""Where one training step's time goes: torch.profiler's self time per operator over the real
train_step (training/run.py) of a config, and the share of it the matrix products take.

    python -m tools.step_profile [CONFIG] [section.key=value ...] [--steps 20] [--rows 15]

Prints the step's median time (warmed up, then timed alone, outside the profiler), the operators by
self time, and the matrix products' share and GFLOP/s (6 x the weights of every linear layer, the LM
head's included, per token: attention's own products, inside SDPA, are not counted). Run it on a
machine left to itself; to see an AVX2-only CPU on a newer one, set ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 (BENCHMARKS.md, "Where a training step's time goes").
"""

from __future__ import annotations

from common.errors import cli  # first: a Ctrl-C while torch loads is one line

# isort: split
import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from runs.config import load_config
from training.plan import plan_run, run_dataset
from training.run import start_run, train_step

MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("args", nargs="*", help="CONFIG and section.key=value overrides")
    p.add_argument("--steps", type=int, default=20, help="steps timed, and steps profiled")
    p.add_argument("--rows", type=int, default=15, help="operators listed")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    config = a.args[0] if a.args and "=" not in a.args[0] else None
    overrides = [x for x in a.args if "=" in x]
    request = load_config(config, ["train.out_dir=/tmp/tinygpt-step-profile", *overrides])
    run = start_run(plan_run(request, run_dataset(request)))
    for it in range(10):  # warm-up: allocator, kernels' first calls
        train_step(run, it)
    times = []
    for it in range(10, 10 + a.steps):
        start = time.perf_counter()
        train_step(run, it)
        times.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for it in range(10 + a.steps, 10 + 2 * a.steps):
            train_step(run, it)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in MATMULS)
    step = statistics.median(times)
    # forward and backward through every linear layer's matrix (the LM head's too): 6 per weight
    linear = (m for m in run.model.modules() if isinstance(m, torch.nn.Linear))
    flops = 6 * sum(m.weight.numel() for m in linear)
    print(f"{run.rt.precision}, {torch.get_num_threads()} threads: {step * 1e3:.1f} ms a step")
    print(events.table(sort_by="self_cpu_time_total", row_limit=a.rows, max_name_column_width=44))
    seconds = matmul / 1e6 / a.steps
    gflop = flops * request.cfg.tokens_per_iter / 1e9
    print(
        f"matrix products: {100 * matmul / total:.0f}% of the self time, {seconds * 1e3:.1f} ms a "
        f"step for {gflop:.2f} GFLOP ({gflop / seconds:.0f} GFLOP/s); the step: "
        f"{gflop / step:.0f} GFLOP/s"
    )
    return 0


if __name__ == "__main__":
    cli(main)
