"""nanoGPT's CPU recipe and tinygpt's default training step side by side: one process, alternating
every step, so that a shared machine's changes of speed fall on both alike.

    python -m tools.vs_nanogpt PATH/TO/nanoGPT [section.key=value ...] [--pairs 150]

nanoGPT's side is its train.py loop as it runs on a CPU (fp32, no autocast, its get_batch over
data/shakespeare_char/train.bin, the AdamW configure_optimizers makes: fused on CUDA only, clipping
at 1.0), its model.py at the recipe (4 layers x 128, 4 heads, context 64, batch 12, no dropout, no
biases: train.py's `bias = False`). tinygpt's is training/run.py's train_step on the default config
(GPT-2 style: biases), with the overrides given (`model.bias=false`: nanoGPT's network). Prints
each side's median ms a step, the tokens/s ratio, and each side's MFU: nanoGPT's estimate_mfu count
(6N + 12 L H Q T a token) against the fp32 matrix-product peak measured between the steps.
"""

from __future__ import annotations

from common.errors import UserError, cli  # first: a Ctrl-C while torch loads is one line

# isort: split
import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from runs.config import load_config
from training.plan import plan_run, run_dataset
from training.run import start_run, train_step

RECIPE = dict(block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0, bias=False)
BATCH = 12


def nanogpt_step(checkout: Path, data: Path, vocab_size: int):
    """A function running one of nanoGPT's training iterations (train.py's loop body on a CPU),
    and its model's FLOPs an iteration by nanoGPT's own count."""
    source = checkout / "model.py"
    if not source.is_file():
        raise UserError(f"{checkout} has no model.py: give the folder of a nanoGPT checkout")
    spec = importlib.util.spec_from_file_location("nanogpt_model", source)
    nano = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nano)
    torch.manual_seed(1337)
    model = nano.GPT(nano.GPTConfig(vocab_size=vocab_size, **RECIPE))
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    T = RECIPE["block_size"]

    def get_batch():  # train.py's, as written there
        ids = np.memmap(data / "train.bin", dtype=np.uint16, mode="r")
        ix = torch.randint(len(ids) - T, (BATCH,))
        x = torch.stack([torch.from_numpy((ids[i : i + T]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((ids[i + 1 : i + 1 + T]).astype(np.int64)) for i in ix])
        return x, y

    batch = [get_batch()]

    def step():
        _, loss = model(*batch[0])
        batch[0] = get_batch()  # train.py fetches the next batch between forward and backward
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    L, H, Q = RECIPE["n_layer"], RECIPE["n_head"], RECIPE["n_embd"] // RECIPE["n_head"]
    per_token = 6 * model.get_num_params() + 12 * L * H * Q * T
    return step, per_token * T * BATCH


def fp32_peak() -> float:
    """FLOP/s of a 1024^3 fp32 matrix product, the median of five."""
    a = torch.randn(1024, 1024)
    a @ a
    times = []
    for _ in range(5):
        start = time.perf_counter()
        a @ a
        times.append(time.perf_counter() - start)
    return 2 * 1024**3 / statistics.median(times)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("nanogpt", type=Path, help="the folder of a nanoGPT checkout")
    p.add_argument("overrides", nargs="*", help="section.key=value for tinygpt's side")
    p.add_argument("--pairs", type=int, default=150, help="steps timed on each side")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    request = load_config(None, ["train.out_dir=/tmp/tinygpt-vs-nanogpt", *a.overrides])
    plan = plan_run(request, run_dataset(request))
    run = start_run(plan)
    nano, flops = nanogpt_step(a.nanogpt, plan.dataset.folder, run.cfg.model.vocab_size)
    it = 0

    def ours():
        nonlocal it
        train_step(run, it)
        it += 1

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    for _ in range(10):  # warm-up: allocators, kernels' first calls
        nano(), ours()
    times = {"nanoGPT": [], "tinygpt": []}
    peaks = []
    for k in range(a.pairs):
        order = ("nanoGPT", "tinygpt") if k % 2 else ("tinygpt", "nanoGPT")
        for side in order:
            times[side].append(timed(nano if side == "nanoGPT" else ours))
        if k % 25 == 0:
            peaks.append(fp32_peak())
    peak = statistics.median(peaks)
    medians = {side: statistics.median(t) for side, t in times.items()}
    print(f"fp32 matrix-product peak (1024^3, measured between steps): {peak / 1e9:.0f} GFLOP/s")
    for side, m in medians.items():
        mfu = flops / m / peak
        print(f"{side}: {m * 1e3:.2f} ms a step (median of {a.pairs}), MFU {mfu:.0%}")
    print(f"tinygpt's tokens/s against nanoGPT's: {medians['nanoGPT'] / medians['tinygpt']:.2f}x")
    return 0


if __name__ == "__main__":
    cli(main)
