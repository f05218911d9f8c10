"""What a GGUF export costs in accuracy, and what llama.cpp gains in speed: a run exported at each --dtype and
run in llama.cpp (llama-cpp-python) against our own model on the same windows of its val text.

    python -m tools.gguf_error out/shakespeare_char [--windows 32] [--dtypes f32 f16 q8_0] [--speed]

Per dtype: the file's size, the largest logit error, the mean error in log probability, the val loss both
ways, how often the most likely token agrees, and for a char model the probability llama.cpp gives the
<|endoftext|> the GGUF adds. --speed times 50 greedy tokens from a 6-token prompt in llama.cpp and in our
decoding loop (what sample.py runs), alternating in one process, the median of 5 rounds each.
tests/test_gguf.py holds these errors to their bounds; BENCHMARKS.md, "GGUF export", has the figures.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from model import generate
from runs.pretrained import load_model

ROOT = Path(__file__).resolve().parent.parent


def llama(path: Path, n_ctx: int):
    import llama_cpp

    return llama_cpp.Llama(str(path), n_ctx=n_ctx, logits_all=True, n_threads=2, verbose=False)


def file_errors(run: str, dtype: str, windows: list[list[int]], ours: torch.Tensor, folder: Path) -> dict:
    """The errors of the GGUF at `dtype` against our logits `ours` (float64) on `windows`."""
    path = folder / f"{dtype}.gguf"
    export = [sys.executable, "export.py", run, str(path), "--dtype", dtype, "--overwrite"]
    subprocess.run(export, cwd=ROOT, check=True, capture_output=True)
    llm, rows = llama(path, len(windows[0])), []
    for ids in windows:
        llm.reset()
        llm.eval(ids)
        rows.append(np.array(llm.scores[: len(ids)]))
    llm.close()
    full = torch.from_numpy(np.stack(rows)).double()
    theirs, targets = full[..., : ours.shape[-1]], torch.tensor(windows)[:, 1:, None]

    def loss(logits: torch.Tensor) -> float:
        return -logits.log_softmax(-1)[:, :-1].gather(-1, targets).mean().item()

    result = {
        "dtype": dtype,
        "mib": path.stat().st_size / 2**20,
        "max_logit_error": (theirs - ours).abs().max().item(),
        "mean_logp_error": (theirs.log_softmax(-1) - ours.log_softmax(-1)).abs().mean().item(),
        "loss": loss(theirs),
        "our_loss": loss(ours),
        "argmax_agrees": (theirs.argmax(-1) == ours.argmax(-1)).double().mean().item(),
    }
    if full.shape[-1] > ours.shape[-1]:  # a char vocabulary's added <|endoftext|>
        result["p_endoftext"] = full.softmax(-1)[..., -1].mean().item()
    return result


def speed(run: str, path: Path, prompt: list[int], n: int = 50, rounds: int = 5) -> tuple[float, float]:
    """Tokens/s of greedy decoding: (llama.cpp, our loop), medians of alternating rounds."""
    model = load_model(run).model
    llm, times = llama(path, model.config.block_size), ([], [])
    for _ in range(rounds):
        start = time.perf_counter()
        llm.reset()
        steps = llm.generate(prompt, temp=0.0, top_k=1)
        [next(steps) for _ in range(n)]
        times[0].append(time.perf_counter() - start)
        start = time.perf_counter()
        list(generate(model, torch.tensor([prompt]), n, temperature=0))
        times[1].append(time.perf_counter() - start)
    llm.close()
    return n / statistics.median(times[0]), n / statistics.median(times[1])


def gguf_errors(run: str, dtypes: list[str], n_windows: int, folder: Path) -> list[dict]:
    loaded = load_model(run)
    model, size = loaded.model, loaded.model.config.block_size
    ids = loaded.tokenizer.encode((ROOT / "data" / "tinyshakespeare.txt").read_text()[-100_000:]).tolist()
    windows = [ids[i : i + size] for i in range(0, n_windows * size, size)]
    with torch.no_grad():
        ours = model(torch.tensor(windows))[0].double()
    return [file_errors(run, dtype, windows, ours, folder) for dtype in dtypes]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.gguf_error", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a training run's folder or a checkpoint (its val text: tiny Shakespeare's)")
    p.add_argument("--windows", type=int, default=32, help="context-long windows compared (default 32)")
    p.add_argument("--dtypes", nargs="+", default=["f32", "f16", "q8_0"])
    p.add_argument("--speed", action="store_true", help="also time greedy decoding, llama.cpp against ours")
    return p.parse_args(argv)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        for r in gguf_errors(args.run, args.dtypes, args.windows, Path(tmp)):
            print(
                f"{r['dtype']}: {r['mib']:.2f} MiB, max |dlogit| {r['max_logit_error']:.4f}, mean |dlogp| "
                f"{r['mean_logp_error']:.2e}, loss {r['loss']:.5f} (ours {r['our_loss']:.5f}), argmax agrees "
                f"{r['argmax_agrees']:.2%}"
                + (f", p(<|endoftext|>) {r['p_endoftext']:.2e}" if "p_endoftext" in r else "")
            )
            if args.speed:
                prompt = load_model(args.run).tokenizer.encode("ROMEO:").tolist()
                theirs, ours = speed(args.run, Path(tmp) / f"{r['dtype']}.gguf", prompt)
                print(f"  greedy decoding: llama.cpp {theirs:,.0f} tokens/s, ours {ours:,.0f} tokens/s")


if __name__ == "__main__":
    main(sys.argv[1:])
