"""Plot training runs against each other: one metric from each run's metrics.jsonl, overlaid in one PNG.

    python plot.py RUN [RUN ...] [--x tokens|time|iter] [--metric val_loss|val_bpb|train_loss|...] [--out F]

Each RUN is a training run's out_dir. A line's label is its out_dir and the config keys whose values differ
between the runs (read from the config.yaml of each run's checkpoint). A star marks the exact value over the
whole val split that train.py measures at the end (final_val_loss, final_val_bpb). --x time is training
seconds (evals excluded).
"""

from __future__ import annotations

from common.errors import UserError, run_cli  # first: a Ctrl-C while torch loads is one line

# isort: split
import argparse
from pathlib import Path
from typing import Any

from common import json_text
from common.arguments import ScriptParser
from interp.curves import X_AXES, evals, numbers, plot_runs, points
from runs import checkpoint
from runs.config import to_dict
from training.tracking import read_metrics

IGNORED = {"train.out_dir", "train.resume", "train.overwrite", "data.dir", "log.interval"}  # bookkeeping
MAX_KEYS = 5  # config differences written into a label


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ScriptParser(prog="python plot.py", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="RUN", help="training runs' out_dirs")
    p.add_argument("--x", choices=list(X_AXES), default="tokens", help="the x axis (default: %(default)s)")
    p.add_argument("--metric", default="val_loss", help="a key of metrics.jsonl (default: %(default)s)")
    p.add_argument("--out", default="runs.png", help="the PNG to write (default: %(default)s)")
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
    """The run's config as dotted keys (empty when it wrote no checkpoint)."""
    try:
        cfg = checkpoint.find(run).config()
    except UserError:
        return {}
    out = {}
    for section, values in to_dict(cfg).items():
        if values is None:  # an optional section that is off (lora)
            out[section] = None
            continue
        out.update({f"{section}.{k}": v for k, v in values.items() if f"{section}.{k}" not in IGNORED})
    return out


def labels(runs: list[str]) -> list[str]:
    """Each run's out_dir and the config values in which the runs differ."""
    configs = [flat_config(r) for r in runs]
    keys = (
        [k for k in configs[0] if len({json_text.dumps(c.get(k)) for c in configs}) > 1]
        if len(runs) > 1
        else []
    )
    keys += [k for c in configs[1:] for k in c if k not in configs[0] and k not in keys]
    out = []
    for run, cfg in zip(runs, configs):
        shown = [f"{k}={cfg.get(k)}" for k in keys[:MAX_KEYS]]
        more = f" +{len(keys) - MAX_KEYS} more" if len(keys) > MAX_KEYS else ""
        out.append(run + (": " + ", ".join(shown) + more if shown else ""))
    return out


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    records = [read_run(r) for r in args.runs]
    check_metric(records, args.metric, args.x)
    out = Path(args.out)
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
    """Refuse, in one line, a metric no run can draw against `x`: not in metrics.jsonl, not one number (a
    nested record: its numbers are named by dotted paths), or in no record that has the x axis's key."""
    have = sorted({k for rows in records for r in evals(rows) for k in numbers(r)})
    if metric not in have:
        inside = [k for k in have if k.startswith(f"{metric}.")]
        if inside:
            raise UserError(f"--metric {metric} holds several numbers; plot one of: {', '.join(inside)}")
        shown = [k for k in have if "." not in k]
        raise UserError(f"--metric {metric}: no run has it; metrics.jsonl has {', '.join(shown)}")
    key = X_AXES[x][0]
    if not any(points(rows, metric, key)[0] for rows in records):
        others = [
            name for name, (k, _) in X_AXES.items() if any(points(rows, metric, k)[0] for rows in records)
        ]
        instead = f"; try --x {' or '.join(others)}" if others else ""
        raise UserError(f"--metric {metric}: no record has it together with {key}, the --x {x} axis{instead}")


if __name__ == "__main__":
    run_cli(main)
