"""tools.bench's attention measurement (`--only attention`): forward and backward of attention
alone, full causal against a window in blocks and the window as a dense mask, time and peak memory
against the sequence length, and their picture."""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from common.errors import UserError
from model.gpt import attend_fused
from model.local_attention import LocalSpan, attend_locally, band_mask
from runs.config import from_arguments
from runs.runtime import Runtime, setup
from tools.bench.training import format_table

ATTENTION_CONTEXTS = tuple(256 * 2**i for i in range(7))  # 256 ... 16,384
ATTENTION_SHAPE = (1, 4, 32)  # batch, heads, head size
# past it, the dense-mask window's mask is a gigabyte of floats and seconds a round
DENSE_MASK_UP_TO = 8192


def attention_section(args: argparse.Namespace, groups: list) -> dict:
    """--only attention: measure, print, draw; the results."""
    try:
        contexts = [int(t) for t in args.contexts.split(",")]
    except ValueError:
        raise UserError(
            f"--contexts takes sequence lengths separated by commas, got {args.contexts}"
        ) from None
    cfg = from_arguments(groups[0]).cfg
    rt = setup(cfg.train.device, "fp32", cfg.model.n_embd, cfg.train.threads)
    rows = attention_cost(rt, args.window, contexts, args.rounds)
    print(format_table(rows))
    B, H, d = ATTENTION_SHAPE
    where = (
        f"{torch.get_num_threads()} threads"
        if rt.device.type == "cpu"
        else torch.cuda.get_device_name()
    )
    title = (
        f"attention forward + backward, B={B}, H={H}, d={d}, fp32, on {rt.device.type} ({where})"
    )
    draw_attention_cost(rows, Path(args.plot), title)
    print(f"picture in {args.plot}", file=sys.stderr)
    return {"attention": rows, "attention_device": f"{rt.device} ({where})"}


def attention_cost(rt: Runtime, window: int, contexts: list[int], rounds: int) -> list[dict]:
    """Forward + backward of attention alone for each path and length (see the module docstring)."""
    B, H, d = ATTENTION_SHAPE
    paths = attention_paths(window)
    inputs = {
        T: [torch.randn(B, H, T, d, device=rt.device, requires_grad=True) for _ in range(3)]
        for T in contexts
    }
    cases = [(T, name) for T in contexts for name, (_, longest) in paths.items() if longest >= T]

    def step(T: int, name: str) -> None:
        x = inputs[T]
        paths[name][0](*x).sum().backward()
        for t in x:
            t.grad = None
        rt.synchronize()

    repeats = {}
    for case in cases:  # warm-up; short cases repeat within a round, to about 50 ms
        start = time.perf_counter()
        step(*case)
        repeats[case] = max(1, min(50, round(0.05 / (time.perf_counter() - start))))
    times: dict = {case: [] for case in cases}
    # alternate, so slow spells of a shared machine hit every path and length
    for _ in range(rounds):
        for case in cases:
            start = time.perf_counter()
            for _ in range(repeats[case]):
                step(*case)
            times[case].append((time.perf_counter() - start) / repeats[case])
    rows = []
    for T, name in cases:
        ms = statistics.median(times[T, name]) * 1e3
        mb = peak_allocated(lambda: step(T, name), rt.device) / 2**20  # noqa: B023 (called at once)
        rows.append(
            {
                "context": T,
                "path": name,
                "ms": round(ms, 2),
                "us_per_token": round(ms * 1e3 / T, 2),
                "peak_MB": round(mb, 2),
            }
        )
    full = {r["context"]: r for r in rows if r["path"] == "full causal"}
    for r in rows:
        r["time_vs_full"] = round(r["ms"] / full[r["context"]]["ms"], 3)
        r["memory_vs_full"] = round(r["peak_MB"] / full[r["context"]]["peak_MB"], 3)
    return rows


def attention_paths(window: int) -> dict:
    """name -> (attention(q, k, v), longest T measured): full causal, the window in blocks, the
    window as a dense mask."""

    def dense(q, k, v):
        T = q.size(2)
        return attend_fused(q, k, v, band_mask(T, T, 0, window, q.device), 0.0)

    return {
        "full causal": (lambda q, k, v: attend_fused(q, k, v, None, 0.0), math.inf),
        f"window {window}": (
            lambda q, k, v: attend_locally(q, k, v, LocalSpan(window), 0.0),
            math.inf,
        ),
        f"window {window}, dense mask": (dense, DENSE_MASK_UP_TO),
    }


def peak_allocated(fn, device: torch.device) -> float:
    """Bytes allocated at most above what was allocated before, while fn() runs: CUDA's allocator
    statistics; on a CPU the running sum of torch.profiler's memory events (the allocator's own, so
    memory a caching malloc keeps from earlier work does not hide a peak, as the resident size
    would)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    held = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        held += event.nbytes()
        peak = max(peak, held)
    return peak


def draw_attention_cost(rows: list[dict], path: Path, title: str) -> None:
    """Time and peak memory against T on log-log axes, one line per path, with T and T^2 guide lines
    through the first point of full causal attention (matplotlib's object API, as
    training/curves.py)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    fig = Figure(figsize=(10, 4.2), dpi=90, layout="constrained")
    axes = fig.subplots(1, 2)
    names = list(dict.fromkeys(r["path"] for r in rows))
    for ax, key, label in zip(
        axes, ("ms", "peak_MB"), ("forward + backward, ms", "peak memory, MB")
    ):
        for name in names:
            mine = [r for r in rows if r["path"] == name]
            ax.plot([r["context"] for r in mine], [r[key] for r in mine], marker="o", label=name)
        first = next(r for r in rows if r["path"] == "full causal")
        ts = sorted({r["context"] for r in rows})
        for power, style in ((1, ":"), (2, "--")):
            guide = [first[key] * (t / first["context"]) ** power for t in ts]
            ax.plot(
                ts, guide, style, color="grey", linewidth=1, label="∝ T" if power == 1 else "∝ T²"
            )
        ax.set(xscale="log", yscale="log", xlabel="sequence length T", ylabel=label)
        ax.set_xticks(ts, [f"{t:,}" for t in ts], fontsize=7)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
