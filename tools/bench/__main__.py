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

from common.errors import UserError, cli  # first: a Ctrl-C while torch loads is one line

# isort: split
import argparse
import sys
import time
from pathlib import Path

import torch

from common import json_text
from tools.bench.attention import ATTENTION_CONTEXTS, attention_section
from tools.bench.decoding import decode_by_position, sampling
from tools.bench.training import Setup, build_setup, format_table, memory_scaling, train_section

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
