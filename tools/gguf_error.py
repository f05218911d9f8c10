"""What a GGUF export costs in accuracy, and what llama.cpp gains in speed: a run exported at each
--dtype and run in llama.cpp (llama-cpp-python) against our own model on the same windows of its val
text.

    python -m tools.gguf_error out/shakespeare_char [--windows 32] [--dtypes f32 f16 q8_0] [--speed]
                               [--tokens 50] [--prompt ROMEO:] [--rounds 5] [--busy]

Per dtype: the file's size, the largest logit error, the mean error in log probability, the val loss
both ways, argmax agreement, and for a char model the probability of the <|endoftext|> the GGUF
adds. --speed times greedy tokens after --prompt in llama.cpp (1 and 2 threads) and in our loop
(eager and --compile), alternating, medians of --rounds; --busy beside a busy process.
tests/test_gguf.py holds the errors to their bounds; BENCHMARKS.md, "GGUF export", has the figures.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from common.errors import UserError
from common.threads import busy_neighbour
from runs.pretrained import load_model
from sampling.generate import generate

ROOT = Path(__file__).resolve().parent.parent


def llama(path: Path, n_ctx: int, threads: int = 2):
    import llama_cpp

    return llama_cpp.Llama(
        str(path), n_ctx=n_ctx, logits_all=True, n_threads=threads, verbose=False
    )


def file_errors(
    run: str, dtype: str, windows: list[list[int]], ours: torch.Tensor, folder: Path
) -> dict:
    """The errors of the GGUF at `dtype` against our logits `ours` (float64) on `windows`."""
    path = folder / f"{dtype}.gguf"
    export = [sys.executable, "export.py", run, str(path), "--dtype", dtype, "--overwrite"]
    subprocess.run(export, cwd=ROOT, check=True, capture_output=True)
    llm = llama(path, len(windows[0]))
    rows = []
    for ids in windows:
        llm.reset()
        llm.eval(ids)
        rows.append(np.array(llm.scores[: len(ids)]))
    llm.close()
    full = torch.from_numpy(np.stack(rows)).double()
    theirs = full[..., : ours.shape[-1]]
    targets = torch.tensor(windows)[:, 1:, None]

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


def speed(
    run: str, path: Path, prompt: list[int], n: int, rounds: int = 5, busy: bool = False
) -> dict:
    """Tokens/s of greedy decoding, n tokens after `prompt`, medians of rounds alternating between
    llama.cpp (1 and 2 threads) and our loop as sample.py runs it (each token read back), eager and
    compiled; each round beside a busy process with `busy`. A round times the prompt and every
    token, both sides alike."""
    model = load_model(run).model
    # llama.cpp stops at its context; ours would slide
    if len(prompt) + n > model.config.block_size:
        raise UserError(
            f"--tokens {n} and a prompt of {len(prompt)} pass the context of "
            f"{model.config.block_size}"
        )
    llms = {
        f"llama.cpp, {t} thread{'s' * (t > 1)}": llama(path, model.config.block_size, t)
        for t in (1, 2)
    }

    def theirs(llm) -> None:
        llm.reset()
        steps = llm.generate(prompt, temp=0.0, top_k=1)
        [next(steps) for _ in range(n)]

    def ours(compile: bool) -> None:
        [
            t.tolist()
            for t in generate(model, torch.tensor([prompt]), n, temperature=0, compile=compile)
        ]

    paths = {name: partial(theirs, llm) for name, llm in llms.items()}
    paths |= {"ours, eager": partial(ours, False), "ours, --compile": partial(ours, True)}
    paths["ours, --compile"]()  # compiled (or loaded) before the rounds
    times = {name: [] for name in paths}
    for _ in range(rounds):
        with busy_neighbour(busy):
            for name, fn in paths.items():
                # llama.cpp's threads spin a while after its run: ours would share the cores
                time.sleep(0.1)
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    for llm in llms.values():
        llm.close()
    return {name: n / statistics.median(t) for name, t in times.items()}


def gguf_errors(run: str, dtypes: list[str], n_windows: int, folder: Path) -> list[dict]:
    loaded = load_model(run)
    model = loaded.model
    size = loaded.model.config.block_size
    ids = loaded.tokenizer.encode(
        (ROOT / "data" / "tinyshakespeare.txt").read_text()[-100_000:]
    ).tolist()
    windows = [ids[i : i + size] for i in range(0, n_windows * size, size)]
    with torch.no_grad():
        ours = model(torch.tensor(windows))[0].double()
    return [file_errors(run, dtype, windows, ours, folder) for dtype in dtypes]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tools.gguf_error", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "run", help="a training run's folder or a checkpoint (its val text: tiny Shakespeare's)"
    )
    p.add_argument(
        "--windows", type=int, default=32, help="context-long windows compared (default 32)"
    )
    p.add_argument("--dtypes", nargs="+", default=["f32", "f16", "q8_0"])
    p.add_argument(
        "--speed", action="store_true", help="also time greedy decoding, llama.cpp against ours"
    )
    p.add_argument("--tokens", type=int, default=50, help="--speed: tokens generated (default 50)")
    p.add_argument("--prompt", default="ROMEO:", help="--speed: the prompt (default ROMEO:)")
    p.add_argument(
        "--rounds", type=int, default=5, help="--speed: rounds, the median kept (default 5)"
    )
    p.add_argument("--busy", action="store_true", help="--speed: each round beside a busy process")
    return p.parse_args(argv)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        for r in gguf_errors(args.run, args.dtypes, args.windows, Path(tmp)):
            print(
                f"{r['dtype']}: {r['mib']:.2f} MiB, max |dlogit| {r['max_logit_error']:.4f}, mean "
                f"|dlogp| {r['mean_logp_error']:.2e}, loss {r['loss']:.5f} (ours "
                f"{r['our_loss']:.5f}), argmax agrees {r['argmax_agrees']:.2%}"
                + (f", p(<|endoftext|>) {r['p_endoftext']:.2e}" if "p_endoftext" in r else "")
            )
            if args.speed:
                prompt = load_model(args.run).tokenizer.encode(args.prompt).tolist()
                path = Path(tmp) / f"{r['dtype']}.gguf"
                rates = speed(args.run, path, prompt, args.tokens, args.rounds, args.busy)
                where = "beside a busy process" if args.busy else "quiet"
                print(
                    f"  greedy decoding, {args.tokens} tokens after {len(prompt)}, {where}: "
                    "tokens/s"
                )
                print(
                    "".join(f"    {name:<20} {rate:>9,.0f}\n" for name, rate in rates.items()),
                    end="",
                )


if __name__ == "__main__":
    main(sys.argv[1:])
