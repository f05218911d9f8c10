"""Plot training runs against each other: one metric from each run's metrics.jsonl, overlaid in one
PNG.

    python plot.py RUN [RUN ...] [--x tokens|time|iter] [--out F]
                   [--metric val_loss|val_bpb|train_loss|...]

Each RUN is a training run's out_dir. A line's label is its out_dir and every config key whose value
differs between the runs, wrapped, as each run last ran (its last/config.yaml: a run resumed with
more iterations shows them). A star marks the exact value over the whole val split that train.py
measures at the end (final_val_loss, final_val_bpb). --x time is training seconds (evals excluded).
The picture goes beside the first run (out/runs.png for out/a) unless --out names one. It reads the
files as plain JSON and YAML: plot.py loads neither torch's model nor the training code.
"""

from __future__ import annotations

from common.errors import UserError, cli  # first: a Ctrl-C while torch loads is one line

# isort: split
import argparse
import textwrap
from pathlib import Path
from typing import Any

import yaml

from common import json_text
from common.arguments import ScriptParser
from common.json_text import read_metrics
from training.curves import X_AXES, evals, numbers, plot_runs, points

# bookkeeping
IGNORED = {"train.out_dir", "train.resume", "train.overwrite", "data.dir", "log.interval"}
# characters per line of a label: every differing key is shown, over as many lines as it takes
WRAP = 72


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ScriptParser(prog="python plot.py", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="RUN", help="training runs' out_dirs")
    p.add_argument(
        "--x", choices=list(X_AXES), default="tokens", help="the x axis (default: %(default)s)"
    )
    p.add_argument(
        "--metric", default="val_loss", help="a key of metrics.jsonl (default: %(default)s)"
    )
    p.add_argument(
        "--out",
        help="the PNG to write (default: runs.png beside the first RUN: out/runs.png for out/a)",
    )
    return p.parse_args(argv)


def read_run(run: str) -> list[dict]:
    """The eval records of a run's metrics.jsonl."""
    path = Path(run) / "metrics.jsonl"
    if not Path(run).is_dir():
        raise UserError(f"no run at {run}: the folder does not exist")
    try:
        records = read_metrics(path)  # a torn line (a run writing it, a crash) is left out
    except FileNotFoundError:
        raise UserError(
            f"{run} has no metrics.jsonl; give a training run's out_dir (train.out_dir)"
        ) from None
    except OSError as e:  # a folder in its place, no permission
        raise UserError(f"{path} cannot be read ({e.strerror or e})") from None
    if not evals(records):
        raise UserError(f"{path} has no evals yet; plot once the run has reached its first eval")
    return records


def flat_config(run: str) -> dict[str, Any]:
    """The config the run last ran with (last/config.yaml, else best/) as dotted keys; empty when it
    wrote no checkpoint or the file cannot be read (the line is drawn without its keys)."""
    for name in ("last", "best"):
        try:
            data = yaml.safe_load((Path(run) / name / "config.yaml").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if isinstance(data, dict):
            return {k: v for k, v in dotted(data).items() if k not in IGNORED}
    return {}


def dotted(data: dict, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as dotted keys: {"train": {"max_iters": 5}} -> {"train.max_iters": 5}."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(dotted(value, f"{prefix}{key}."))
        else:  # a value, or an optional section that is off (lora: null)
            out[f"{prefix}{key}"] = value
    return out


def labels(runs: list[str]) -> list[str]:
    """Each run's out_dir and every config value in which the runs differ, wrapped to WRAP
    characters."""
    configs = [flat_config(r) for r in runs]
    keys = list(dict.fromkeys(k for c in configs for k in c)) if len(runs) > 1 else []
    keys = [k for k in keys if len({json_text.dumps(c.get(k)) for c in configs}) > 1]
    out = []
    for run, cfg in zip(runs, configs):
        shown = textwrap.fill(
            ", ".join(f"{k}={cfg.get(k)}" for k in keys),
            WRAP,
            break_long_words=False,
            break_on_hyphens=False,
        )
        out.append(f"{run}\n{shown}" if shown else run)
    return out


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    records = [read_run(r) for r in args.runs]
    check_metric(records, args.metric, args.x)
    out = Path(args.out) if args.out else Path(args.runs[0]).parent / "runs.png"
    if out.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise UserError(f"--out {out}: give a .png (or .pdf, .svg) file name")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(
            f"--out {out}: cannot create {out.parent} ({e.strerror or e}); choose another"
        ) from None
    plot_runs(list(zip(labels(args.runs), records)), args.metric, args.x, out)
    print(f"wrote {out}")
    return 0


def check_metric(records: list[list[dict]], metric: str, x: str) -> None:
    """Refuse, in one line, a metric no run can draw against `x`: not in metrics.jsonl, not one
    number (a nested record: its numbers are named by dotted paths), or in no record that has the x
    axis's key."""
    have = sorted({k for rows in records for r in evals(rows) for k in numbers(r)})
    if metric not in have:
        inside = [k for k in have if k.startswith(f"{metric}.")]
        if inside:
            raise UserError(
                f"--metric {metric} holds several numbers; plot one of: {', '.join(inside)}"
            )
        shown = [k for k in have if "." not in k]
        raise UserError(f"--metric {metric}: no run has it; metrics.jsonl has {', '.join(shown)}")
    key = X_AXES[x][0]
    if not any(points(rows, metric, key)[0] for rows in records):
        others = [
            name
            for name, (k, _) in X_AXES.items()
            if any(points(rows, metric, k)[0] for rows in records)
        ]
        instead = f"; try --x {' or '.join(others)}" if others else ""
        raise UserError(
            f"--metric {metric}: no record has it together with {key}, the --x {x} axis{instead}"
        )


if __name__ == "__main__":
    cli(main)
