"""A discovered circuit as a picture (heads.py --discover writes discovered.png): the circuit's
edges on the model's nodes, and beside it the faithfulness-against-edges curve it was cut from.

Left, bottom to top as the residual stream flows: the embeddings, each layer's heads (and its MLP,
right of them), the logits. An arrow is a kept edge into a head's queries (Q), keys (K) or values
(V), an MLP's input or the logits; its width is the edge's score (the fraction of the task's effect
it carries alone). Right: f of the strongest k edges against k, the target, and the circuit's k;
under it, f's interval, the ablation and the metric, which every number depends on. Drawn with
matplotlib's object API."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from common.files import save_figure
from interp.diagram import CURVES, KIND_COLOURS, KIND_NAMES, arrow, layer_axes, positions
from interp.graph import EMBEDDINGS, LOGITS

METRIC_WORDS = {"task": "the task's metric", "kl": "minus the KL divergence"}
MAX_ARROWS = 60  # the strongest kept edges drawn; the JSON has them all


def _nodes(ax, found: dict, where: dict, mlp: bool) -> None:
    used = {e["from"] for e in found["edges"] if e["kept"]} | {
        e["to"] for e in found["edges"] if e["kept"]
    }
    for name, (x, y) in where.items():
        if name in (EMBEDDINGS, LOGITS) or (name.startswith("MLP") and not mlp):
            continue
        big = name in used
        ax.plot(x, y, "s" if name.startswith("MLP") else "o", color="#7f7f7f" if big else "#d0d0d0",
                markersize=14 if big else 6, zorder=3)  # fmt: skip
        if big:
            ax.text(x, y - 0.2, name, ha="center", va="top", fontsize=8, zorder=5)
    box = {"boxstyle": "round,pad=0.4", "facecolor": "#f2f2f2", "edgecolor": "#888888"}
    for name, text in ((EMBEDDINGS, "tokens (embeddings)"), (LOGITS, "answer (logits)")):
        ax.text(*where[name], text, ha="center", va="center", fontsize=9, zorder=4, bbox=box)


def _edges(ax, found: dict, where: dict) -> None:
    kept = [e for e in found["edges"] if e["kept"]][:MAX_ARROWS]
    strongest = max([abs(e["score"]) for e in kept] + [1e-9])
    for e in kept:
        width = 0.6 + 4.5 * abs(e["score"]) / strongest
        label = f"{e['score']:+.2f}" if abs(e["score"]) >= 0.1 * strongest else ""
        arrow(
            ax,
            where[e["from"]],
            where[e["to"]],
            KIND_COLOURS[e["kind"]],
            width,
            CURVES[e["kind"]],
            label,
        )


def _curve(ax, found: dict) -> None:
    ks = [int(k) for k in found["curve"]]
    ax.plot(ks, list(found["curve"].values()), "o-", color="#333333", markersize=3)
    ax.axhline(
        found["target"],
        color="#b2182b",
        linestyle="--",
        linewidth=1,
        label=f"target {found['target']}",
    )
    if found["reached"]:
        ax.axvline(
            found["prefix"], color="#2166ac", linewidth=1, label=f"the strongest {found['prefix']}"
        )
    if max(ks) > 200:
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlim(left=0)
    ax.set(
        xlabel="edges kept (the strongest k)",
        ylabel="faithfulness f",
        ylim=(min(-0.1, *found["curve"].values()), 1.15),
    )
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"area under the curve {found['area']:.3f}", fontsize=9)


def plot_discovered(found: dict, n_layer: int, n_head: int, mlp: bool, path: Path) -> None:
    """discovered.png: `found` as interp/discovery.py's discover returns it."""
    spread = 1.0 if n_head <= 8 else 12.0 / n_head
    width = max(5.0, 1.2 * (n_head + mlp) * spread + 1.5)
    fig = Figure(figsize=(width + 5.0, 2.6 + 1.8 * (n_layer + 1)), layout="constrained")
    ax, side = fig.subplots(1, 2, width_ratios=[width, 5.0])
    where = positions(n_layer, n_head, spread)
    _nodes(ax, found, where, mlp)
    _edges(ax, found, where)
    layer_axes(ax, where, n_layer)
    for kind, colour in KIND_COLOURS.items():
        if kind != "mlp" or mlp:
            ax.plot([], [], color=colour, linewidth=3, label=KIND_NAMES[kind])
    ax.legend(loc="upper left", fontsize=8, frameon=False, title="an arrow", title_fontsize=8)
    _curve(side, found)
    low, high = found["interval"]
    fig.suptitle(
        f"{found['size']} edges, f = {found['faithfulness']:.2f} [{low:.2f}, {high:.2f}] under "
        f"{found['ablation']} ablation ({METRIC_WORDS[found['metric']]})\n{found['task']}",
        fontsize=9,
    )
    save_figure(fig, path, dpi=120)


def plot_circuits_training(found: dict, path: Path) -> None:
    """circuits_training.png: the loss, the role scores, K-composition, the in-context learning
    score, and what the final circuit carries (and its faithfulness, on its own axis) against
    iteration; the steepest change of each shaded."""
    evals = found["evals"]
    its = [e["iter"] for e in evals]
    fig = Figure(figsize=(8.5, 8.0), layout="constrained")
    axes = fig.subplots(4, 1, sharex=True)
    panels = [
        (axes[0], [("val_loss", "val loss", "#333333")]),
        (axes[1], [("previous_token", "best previous-token score", "#9467bd"),
                   ("induction", "best induction score", "#d62728"),
                   ("k_composition", "strongest K-composition", "#ff7f0e")]),
        (axes[2], [("icl_score", "in-context learning score", "#2ca02c")]),
        (axes[3], [("carried", "what the final circuit carries (nats)", "#1f77b4")]),
        (axes[3].twinx(), [("faithfulness", "its faithfulness f (right)", "#8c8c8c")]),
    ]  # fmt: skip
    for ax, curves in panels:
        for key, label, colour in curves:
            values = [e.get(key) for e in evals]
            if all(v is None for v in values):
                continue
            points = [(i, v) for i, v in zip(its, values) if v is not None]
            ax.plot(*zip(*points), "o-", color=colour, markersize=3, label=label)
            change = found["phase_change"].get(key)
            if change:
                ax.axvspan(change["from"], change["to"], color=colour, alpha=0.12)
        ax.legend(fontsize=8, loc="best")
    base = next((e["k_baseline"] for e in evals if "k_baseline" in e), None)
    if base is not None:
        axes[1].axhline(base, color="#ff7f0e", linestyle=":", linewidth=1)
    panels[-1][0].set_ylim(0, 1.1)
    panels[-1][0].legend(fontsize=8, loc="center right")
    axes[3].set_xlabel("iteration")
    fig.suptitle(
        f"circuits through training: {len(found['circuit'])} edges of the final circuit, "
        f"{found['ablation']} ablation\n{found['task']}",
        fontsize=9,
    )
    save_figure(fig, path, dpi=110)
