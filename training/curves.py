"""Curves of training runs, from their metrics.jsonl records: one run's OUT_DIR/loss.png, and runs
overlaid.

`plot_run` draws train and val loss against tokens seen and, in a second panel, against training
seconds, with the learning rate on a twin axis; the exact loss over the whole val split
(`final_val_loss`), where the run measured one, is a star at its end. `plot_runs` overlays one
metric of several runs against tokens, training seconds or iterations (plot.py). Drawn with
matplotlib's object API onto its Agg canvas, small and without layout engines: train.py redraws
loss.png at every eval and it must stay cheap (see Tracker.plot).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter

from common.files import save_figure

X_AXES = {
    "tokens": ("tokens", "tokens seen"),
    "time": ("elapsed_s", "training seconds"),
    "iter": ("iter", "iteration"),
}
STYLE = {"train_loss": ("train", "tab:blue"), "val_loss": ("val", "tab:orange")}


def evals(records: list[dict]) -> list[dict]:
    """The eval records (metrics.jsonl may hold other lines)."""
    return [r for r in records if "val_loss" in r]


def numbers(record: dict, prefix: str = "") -> dict[str, float]:
    """Every number in a record by its key, those in a nested record by a dotted path
    (heads.icl_score)."""
    out = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out.update(numbers(value, f"{prefix}{key}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[prefix + key] = value
    return out


def points(records: list[dict], metric: str, key: str) -> tuple[list[float], list[float]]:
    """(x, y) of the eval records where `key` and `metric` are both numbers (a record written by an
    older version, or a diverged eval's null, is left out)."""
    found = [numbers(r) for r in evals(records)]
    pairs = [(r[key], r[metric]) for r in found if key in r and metric in r]
    return [x for x, _ in pairs], [y for _, y in pairs]


def plot_run(records: list[dict], path: Path, title: str = "") -> None:
    """Train and val loss against tokens (the learning rate on a twin axis) and against training
    seconds."""
    rows = evals(records)
    fig = Figure(figsize=(11, 3.8), dpi=90)
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.14, top=0.88, wspace=0.36)
    axes = fig.subplots(1, 2)
    for ax, x in zip(axes, ("tokens", "time")):
        key, label = X_AXES[x]
        for metric, (name, color) in STYLE.items():
            ax.plot(*points(rows, metric, key), color=color, marker=".", label=name)
        final = rows[-1].get("final_val_loss") if rows else None
        if isinstance(final, (int, float)) and key in rows[-1]:
            ax.plot(
                [rows[-1][key]],
                [final],
                "*",
                color="tab:red",
                markersize=10,
                label=f"val, exact: {final:.4f}",
            )
        ax.set(xlabel=label, ylabel="loss (nats per token)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    axes[0].xaxis.set_major_formatter(EngFormatter(sep=""))
    lr = axes[0].twinx()
    lr.plot(*points(rows, "lr", "tokens"), color="grey", linestyle=":", linewidth=1)
    lr.set_ylabel("learning rate (dotted)", color="grey")
    lr.tick_params(axis="y", colors="grey", labelsize=8)
    lr.set_ylim(bottom=0)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path)


def plot_runs(runs: list[tuple[str, list[dict]]], metric: str, x: str, path: Path) -> None:
    """One line per run: `metric` against `x` (tokens | time | iter); a star for the exact final
    value."""
    key, label = X_AXES[x]
    # labels with every differing key, wrapped
    lines = sum(name.count("\n") + 1 for name, _ in runs)
    fig = Figure(figsize=(9, 4.6 + 0.16 * lines), dpi=110, layout="constrained")
    ax = fig.subplots()
    for name, records in runs:
        xs, ys = points(records, metric, key)
        (line,) = ax.plot(xs, ys, marker=".", label=name)
        final = evals(records)[-1].get(f"final_{metric}") if xs else None
        if isinstance(final, (int, float)):
            ax.plot([xs[-1]], [final], "*", color=line.get_color(), markersize=11)
    ax.set(xlabel=label, ylabel=metric.replace("_", " "), title=f"{metric} against {label}")
    if x == "tokens":
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.grid(alpha=0.3)
    # below the axes: a long label hides no curve
    fig.legend(loc="outside lower center", fontsize=8)
    if any(f"final_{metric}" in r for _, records in runs for r in records):
        ax.text(
            0.99,
            0.01,
            "★ exact, over the whole val split",
            transform=ax.transAxes,
            ha="right",
            fontsize=8,
        )
    save_figure(fig, path)
