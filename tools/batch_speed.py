"""What several samples at once gain: `sample.py --compile` at one sample and at --batch samples,
from each checkout given, the commands alternating over --rounds rounds; the `decoding:` tokens/s
of each, medians, and the batch's over one sample's.

    python -m tools.batch_speed RUN [--checkouts /path/to/before .] [--batch 8] [--tokens 500]
                                [--rounds 5] [--threads 2]

Each checkout compiles its own steps once (its code is in their key; the first call's line says so),
before the rounds. --threads pins the thread count (OMP_NUM_THREADS) so that other processes on the
machine do not change which library runs; 0 leaves sample.py's own choice. BENCHMARKS.md, "Several
samples at once", has the figures.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DECODING = re.compile(r"decoding: [\d,]+ tokens in [\d.,]+ s \(([\d,.]+) tokens/s\)")


def tokens_per_s(checkout: Path, run: str, samples: int, tokens: int, threads: int) -> float:
    """sample.py's `decoding:` figure for `samples` samples generated together."""
    env = os.environ | ({"OMP_NUM_THREADS": str(threads)} if threads else {})
    command = [sys.executable, "sample.py", run, "--compile", "--seed", "1"]
    command += ["--num-samples", str(samples), "--batch-size", str(samples)]
    command += ["--max-new-tokens", str(tokens)]
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True)
    found = DECODING.search(done.stderr)
    if done.returncode or not found:
        raise SystemExit(f"{' '.join(command)} in {checkout} failed:\n{done.stderr}")
    return float(found[1].replace(",", ""))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.batch_speed", description=__doc__)
    p.add_argument("run", help="a training run's out_dir (or a checkpoint folder)")
    p.add_argument("--checkouts", nargs="+", default=[str(ROOT)])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=500)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run = str(Path(args.run).resolve())
    cases = [(Path(c).resolve(), n) for c in args.checkouts for n in (1, args.batch)]
    for checkout, n in cases:  # compiled (or loaded) once, outside the rounds
        tokens_per_s(checkout, run, n, 2, args.threads)
    figures: dict[tuple[Path, int], list[float]] = {case: [] for case in cases}
    for _ in range(args.rounds):
        for checkout, n in cases:
            figures[checkout, n].append(tokens_per_s(checkout, run, n, args.tokens, args.threads))
    for checkout in dict.fromkeys(c for c, _ in cases):
        one, many = (statistics.median(figures[checkout, n]) for n in (1, args.batch))
        each = [" / ".join(f"{x:,.0f}" for x in figures[checkout, n]) for n in (1, args.batch)]
        print(
            f"{checkout}: 1 sample {one:,.0f} tokens/s ({each[0]}); {args.batch} samples "
            f"{many:,.0f} ({each[1]}); {many / one:.2f}x"
        )


if __name__ == "__main__":
    main()
