"""tools.bench's sampling measurements: each decoding path (fp32, int8, several samples, compiled)
against the floor the weights' read sets, full recompute and nanoGPT's generator beside them, and
eager decoding's speed against the position reached."""

from __future__ import annotations

import copy
import itertools
import statistics
import time
from collections import deque
from typing import TYPE_CHECKING

import torch

from common.threads import busy_neighbour
from runs.runtime import Runtime
from sampling.generate import generate, sample_next
from sampling.quantize import quantize_int8
from tools.bench.training import busy_result

if TYPE_CHECKING:
    from tools.bench.training import Setup

POSITIONS = (100, 1000, 4000)
POSITION_SPAN = 100  # steps timed around each position


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


def decode_call(
    rt: Runtime, gen: torch.Generator, m, batch: int, compile: bool, n: int, use_cache: bool = True
):
    """A call that generates n tokens from a one-token prompt at temperature 1, as sample.py's loop
    does."""
    prompt = decode_prompt(rt, batch)
    return lambda: deque(generate(m, prompt, n, 1.0, None, None, gen, use_cache, compile), 0)


def timed_seconds(rt: Runtime, gen: torch.Generator, fn) -> float:
    """Seconds fn() takes to finish, the generator reseeded first so every path draws the same
    tokens."""
    gen.manual_seed(0)
    start = time.perf_counter()
    fn()
    rt.synchronize()
    return time.perf_counter() - start


def decode_prompt(rt: Runtime, batch: int = 1) -> torch.Tensor:
    return torch.zeros((batch, 1), dtype=torch.long, device=rt.device)


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
