"""Measure training and sampling speed, memory and MFU for a config.

    python -m tools.bench [CONFIG] [section.key=value ...]                  # one setup
    python -m tools.bench [CONFIG] [k=v ...] --compare [CONFIG2] [k=v ...]   # two, alternately
    options: --steps N --rounds R --warmup W --only train,sample,memory --sample-tokens N
             --json PATH --busy
    python -m tools.bench --only attention [--window W] [--contexts 256,512,...] [--plot PATH]
    python -m tools.bench CONFIG --only positions      # decoding speed against the position reached

Training runs the real train step (medians over rounds x steps after warm-up, MFU, peak memory);
sampling times each decoding path against the floor memory bandwidth sets; memory is training's at
batch 1 as the context grows. --compare alternates the two setups' rounds in one process, so their
ratio holds on a noisy machine (B defaults to A's config plus B's overrides). How each is measured:
docs/development.md, "Tools".
"""

from __future__ import annotations

import argparse
import copy
import itertools
import math
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch

from common import json_text
from common.errors import UserError, cli
from common.threads import busy_neighbour
from dry_run.hardware import peak_flops
from dry_run.measure import measure_training_memory
from model.gpt import attend_fused
from model.local_attention import LocalSpan, attend_locally, band_mask
from runs.config import Config, from_arguments
from runs.runtime import Runtime, setup
from sampling.generate import generate, sample_next
from sampling.quantize import quantize_int8
from training.plan import plan_run, run_dataset
from training.run import Run, start_run, train_step

CONTEXTS = (512, 1024, 2048, 4096)
ATTENTION_CONTEXTS = tuple(256 * 2**i for i in range(7))  # 256 ... 16,384
ATTENTION_SHAPE = (1, 4, 32)  # batch, heads, head size
# past it, the dense-mask window's mask is a gigabyte of floats and seconds a round
DENSE_MASK_UP_TO = 8192
POSITIONS = (100, 1000, 4000)
POSITION_SPAN = 100  # steps timed around each position


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


# the options that take a value
VALUED = {"--steps", "--rounds", "--warmup", "--only", "--sample-tokens", "--json", "--window"}
VALUED |= {"--contexts", "--plot"}


def split_setups(argv: list[str]) -> tuple[list[str], list[list[str]]]:
    """argv's options, and each setup's `CONFIG [section.key=value ...]` (the groups --compare
    separates)."""
    groups = [[]]
    flags = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--compare":
            groups.append([])
        elif a in VALUED:
            flags += [a, argv[i + 1] if i + 1 < len(argv) else ""]
            i += 1
        elif a.startswith("--"):
            flags.append(a)
        else:
            groups[-1].append(a)
        i += 1
    return flags, groups


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[list[str]]]:
    """The options, and each setup's `CONFIG [section.key=value ...]`."""
    flags, groups = split_setups(argv)
    p = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10, help="timed steps per round (default 10)")
    p.add_argument(
        "--rounds", type=int, default=5, help="rounds; setups alternate each round (default 5)"
    )
    p.add_argument(
        "--warmup", type=int, default=5, help="untimed steps first (compile happens here)"
    )
    p.add_argument(
        "--only", default="train,sample,memory", help="which measurements (default: all)"
    )
    p.add_argument("--sample-tokens", type=int, default=1000)
    p.add_argument(
        "--busy",
        action="store_true",
        help="train and sample: the rounds again beside a busy process (a Python loop), the ratio "
        "reported",
    )
    p.add_argument(
        "--json", default="bench/last.json", help="where to write the results (default %(default)s)"
    )
    p.add_argument(
        "--window", type=int, default=256, help="--only attention: the window (default 256)"
    )
    p.add_argument(
        "--contexts",
        default=",".join(map(str, ATTENTION_CONTEXTS)),
        help="--only attention: sequence lengths (default %(default)s)",
    )
    p.add_argument(
        "--plot",
        default="bench/attention_cost.png",
        help="--only attention: the picture (default %(default)s)",
    )
    args = p.parse_args(flags)
    # B: A's config and overrides, then B's
    if len(groups) == 2 and (not groups[1] or "=" in groups[1][0]):
        groups[1] = groups[0] + groups[1]
    return args, groups


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


def decode_by_position(s: Setup, rounds: int) -> list[dict]:
    """Seconds per generated token around each of POSITIONS (see the module docstring), medians over
    the steps of all rounds."""
    model = s.run.model.eval()
    torch.set_num_threads(s.threads)
    n = max(POSITIONS) + POSITION_SPAN // 2
    gen = torch.Generator(device=s.rt.device).manual_seed(0)
    steps: dict[int, list[float]] = {p: [] for p in POSITIONS}
    for _ in range(rounds):
        last = time.perf_counter()
        # eager
        tokens = generate(model, decode_prompt(s.rt), n, 1.0, None, None, gen, compile=False)
        for i, token in enumerate(tokens):
            token.item()  # the step is done
            now = time.perf_counter()
            position = i + 1  # the token at position i + 1 was chosen in this step
            for p in POSITIONS:
                if abs(position - p) < POSITION_SPAN // 2:
                    steps[p].append(now - last)
            last = now
    model.train()
    first = statistics.median(steps[POSITIONS[0]])
    return [
        {
            "setup": s.label,
            "position": p,
            "tok_s": round(1 / statistics.median(steps[p]), 1),
            "ms_per_token": round(statistics.median(steps[p]) * 1e3, 3),
            "time_vs_first": round(statistics.median(steps[p]) / first, 3),
        }
        for p in POSITIONS
    ]


def nanogpt_generate(
    model: torch.nn.Module, idx: torch.Tensor, n_tokens: int, generator: torch.Generator
) -> None:
    """nanoGPT's generator, for comparison: crop to the last block_size tokens, one full forward per
    token."""
    for _ in range(n_tokens):
        logits, _ = model(idx[:, -model.config.block_size :], last_only=True)
        idx = torch.cat(
            [idx, sample_next(logits[:, -1], 1.0, None, None, generator)[:, None]], dim=1
        )


def weight_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of weights one decoding step reads: every parameter and buffer once (a tied weight
    once), but one row of a table it looks up (embeddings, rotary tables) unless the LM head reads
    the table whole."""
    tensors = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    lookups = [model.token_emb.weight] + [model.pos_emb.weight] * (model.pos_emb is not None)
    lookups += [b for name, b in model.named_buffers() if name.startswith("rope_")]
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    for t in lookups:
        if t is not model.lm_head.weight:
            total -= (t.numel() - t.size(-1)) * t.element_size()
    return total


def read_bandwidth(model: torch.nn.Module, rt: Runtime) -> float:
    """Bytes/s of the fastest read torch makes of the model's own weight matrices, one after the
    other as a step reads them (a sum over each, which streams its bytes at the width of the vector
    units; median of 20 passes), with whatever the CPU's caches keep between passes kept too: a step
    at batch 1 cannot read them faster. (A matrix-vector product over them is slower: that is what
    the compiled step improves on.)"""
    tables = {id(model.token_emb.weight)} - {id(model.lm_head.weight)}  # looked up a row at a time
    matrices = [
        w.detach().float() for w in model.parameters() if w.dim() == 2 and id(w) not in tables
    ]
    n_bytes = sum(w.numel() * 4 for w in matrices)
    times = []
    for i in range(23):
        start = time.perf_counter()
        for w in matrices:
            w.sum()
        rt.synchronize()
        if i >= 3:  # warm-up
            times.append(time.perf_counter() - start)
    return n_bytes / statistics.median(times)


def memory_bandwidth(rt: Runtime, n_bytes: int = 256 * 2**20) -> float:
    """Bytes/s of the same read over a buffer far larger than any cache: the memory's own
    bandwidth."""
    buffer = torch.ones(n_bytes // 4, device=rt.device)
    times = []
    for i in range(8):
        start = time.perf_counter()
        buffer.sum()
        rt.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return n_bytes / statistics.median(times)


def decode_prompt(rt: Runtime, batch: int = 1) -> torch.Tensor:
    return torch.zeros((batch, 1), dtype=torch.long, device=rt.device)


def decoders(
    model: torch.nn.Module, compiled: bool
) -> dict[str, tuple[torch.nn.Module, int, bool]]:
    """The decoding paths this tool times: name -> (model, batch size, compile); the compiled ones
    when the setup compiles (train.compile)."""
    int8 = quantize_int8(copy.deepcopy(model))
    paths = {
        "fp32": (model, 1, False),
        "int8": (int8, 1, False),
        "fp32 x8 samples": (model, 8, False),
    }
    if compiled:
        paths |= {f"{k} compiled": (m, b, True) for k, (m, b, _) in paths.items()}
    return paths


def timed_seconds(rt: Runtime, gen: torch.Generator, fn) -> float:
    """Seconds fn() takes to finish, the generator reseeded first so every path draws the same
    tokens."""
    gen.manual_seed(0)
    start = time.perf_counter()
    fn()
    rt.synchronize()
    return time.perf_counter() - start


def decode_call(
    rt: Runtime, gen: torch.Generator, m, batch: int, compile: bool, n: int, use_cache: bool = True
):
    """A call that generates n tokens from a one-token prompt at temperature 1, as sample.py's loop
    does."""
    prompt = decode_prompt(rt, batch)
    return lambda: deque(generate(m, prompt, n, 1.0, None, None, gen, use_cache, compile), 0)


def sampling_times(
    s: Setup, paths: dict, n_tokens: int, rounds: int, busy: bool
) -> tuple[dict, ...]:
    """The decoding paths timed: (compile seconds, times, times beside a busy process, read
    bandwidths), the times per path in seconds for the whole n_tokens, one per round."""
    model = paths["fp32"][0]
    rt = s.rt
    gen = torch.Generator(device=s.rt.device)
    compile_s = {
        name: timed_seconds(rt, gen, decode_call(rt, gen, *p, n=8)) for name, p in paths.items()
    }
    times = {name: [] for name in paths}
    busy_times = {name: [] for name in paths}
    bandwidth = []
    for _ in range(rounds):  # alternate, so slow spells of a shared machine hit every path
        # every core reads, whatever count the last decoding settled on
        torch.set_num_threads(s.threads)
        bandwidth.append(read_bandwidth(model, rt))
        for name, p in paths.items():
            times[name].append(timed_seconds(rt, gen, decode_call(rt, gen, *p, n=n_tokens)))
            if busy:
                with busy_neighbour():
                    busy_times[name].append(
                        timed_seconds(rt, gen, decode_call(rt, gen, *p, n=n_tokens))
                    )
    full = decode_call(rt, gen, model, 1, False, n=n_tokens, use_cache=False)
    times["full recompute"] = [timed_seconds(rt, gen, full)]
    times["nanoGPT generator"] = [
        timed_seconds(rt, gen, lambda: nanogpt_generate(model, decode_prompt(rt), n_tokens, gen))
    ]
    return compile_s, times, busy_times, bandwidth


def sampling_rows(
    s: Setup, paths: dict, timed: tuple[dict, ...], floor_s: float, n_tokens: int
) -> list[dict]:
    """One row per decoding path from sampling_times' `timed`: tokens/s, against the floor
    (`floor_s` seconds a step) and against nanoGPT's generator."""
    compile_s, times, busy_times, _ = timed
    nanogpt_step = statistics.median(times["nanoGPT generator"]) / n_tokens
    rows = []
    for name, t in times.items():
        step = statistics.median(t) / n_tokens
        batch = paths[name][1] if name in paths else 1
        rows.append(
            {
                "setup": s.label,
                "path": name,
                "batch": batch,
                "tok_s": round(batch / step, 1),
                "ms_per_step": round(step * 1e3, 2),
                # the floor's time per step over this path's
                "of_floor": float(f"{floor_s / step:.3g}"),
                "vs_nanogpt": round(batch * nanogpt_step / step, 1),
                "compile_s": round(compile_s[name], 1) if name in paths and paths[name][2] else "",
            }
            | busy_result(
                [x / n_tokens for x in t], [x / n_tokens for x in busy_times.get(name, [])]
            )  # per step
        )
    return rows


def sampling(s: Setup, n_tokens: int, rounds: int, busy: bool = False) -> tuple[dict, list[dict]]:
    """Decoding speed against the memory-bandwidth floor, generating n_tokens at temperature 1 from
    a one-token prompt, in fp32 as sample.py generates, in int8, 8 samples at once, and compiled
    when the setup compiles: the paths alternate over `rounds`, each timed on the whole n_tokens
    (medians), between measurements of the read bandwidth. Then, once each, full recompute over the
    same windows and nanoGPT's generator. Returns (the floor, one row per path)."""
    model = s.run.model.eval()
    torch.set_num_threads(s.threads)
    paths = decoders(model, compiled=s.run.compiled)
    timed = sampling_times(s, paths, n_tokens, rounds, busy)
    torch.set_num_threads(s.threads)
    weights = weight_bytes_per_token(model)
    read = statistics.median(timed[3])
    floor = floor_row(s, weights, weight_bytes_per_token(paths["int8"][0]), read)
    rows = sampling_rows(s, paths, timed, weights / read, n_tokens)  # the floor's seconds per step
    model.train()
    return floor, rows


def floor_row(s: Setup, weights: int, int8_weights: int, read: float) -> dict:
    """The sampling floor's row: the bytes a step reads over the fastest read of them (`read`,
    bytes/s), and over the memory's own bandwidth, measured here."""
    memory = memory_bandwidth(s.rt)
    return {
        "setup": s.label,
        "weights_MB_per_token": round(weights / 1e6, 2),
        "int8_weights_MB_per_token": round(int8_weights / 1e6, 2),
        "read_GB_s": round(read / 1e9, 1),
        "floor_ms_per_token": round(weights / read * 1e3, 2),
        "floor_tok_s": round(read / weights, 1),
        "memory_GB_s": round(memory / 1e9, 1),  # the floor if nothing stayed in the caches
        "memory_floor_tok_s": round(memory / weights, 1),
        "threads": s.threads,
    }


def format_table(rows: list[dict]) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    cells = [["n/a" if r.get(k, "") is None else str(r.get(k, "")) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = "  ".join(k.ljust(w) for k, w in zip(keys, widths))
    return "\n".join(
        [line, "-" * len(line)]
        + ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    )


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


def main(argv: list[str]) -> int:
    args, groups = parse_args(argv)
    only = set(args.only.split(","))
    if not only <= {"train", "sample", "memory", "attention", "positions"}:
        raise UserError(
            f"--only takes train, sample, memory, attention and/or positions, got {args.only}"
        )
    results: dict = {
        "command": "python -m tools.bench " + " ".join(argv),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "torch": torch.__version__,
    }
    if "attention" in only:  # attention alone: no model, no data
        results |= attention_section(args, groups)
    main_threads = torch.get_num_threads()
    setups = [Setup("AB"[i] if len(groups) > 1 else "A", g) for i, g in enumerate(groups)]
    for s in setups if only - {"attention"} else []:
        build_setup(s, main_threads)
        print(
            f"{s.label}: {' '.join(s.args) or 'the default config'} "
            f"[{s.rt.device}, {s.rt.precision}, {s.threads} threads]",
            file=sys.stderr,
        )
    if "train" in only:
        results |= train_section(args, setups)
    if "sample" in only:
        measured = [sampling(s, args.sample_tokens, args.rounds, args.busy) for s in setups]
        results["sample_floor"] = [floor for floor, _ in measured]
        results["sample"] = [row for _, rows in measured for row in rows]
        print(format_table(results["sample_floor"]))
        print(format_table(results["sample"]))
    if "memory" in only:
        results["memory"] = [row for s in setups for row in memory_scaling(s)]
        print(format_table(results["memory"]))
    if "positions" in only:
        results["positions"] = [row for s in setups for row in decode_by_position(s, args.rounds)]
        print(format_table(results["positions"]))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json_text.dumps(results, indent=1))
    print(f"results in {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    cli(main)
