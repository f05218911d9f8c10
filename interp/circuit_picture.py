"""Circuits as pictures: what heads.py --circuit finds (circuit.png), a discovered circuit and its
curve (--discover, discovered.png), and circuits through training (circuits_training.png).

A circuit is read bottom to top, as the residual stream flows: the tokens' embeddings at the bottom,
one row of heads per layer (an MLP a square right of them), the answer (the logits) at the top. An
arrow from one node into another says the later one reads what the earlier wrote, through its
queries (Q), keys (K) or values (V), an MLP's input, or into the logits: its colour is that input,
its width its effect (--circuit: the path-patching effect; --discover: the edge's score).
circuit.png names each node with its role and effect and lists the edges with the composition
score of the pair's weights beside; discovered.png puts the faithfulness-against-edges curve it was
cut from beside, with f's interval, the ablation and the metric, which every number depends on.
Drawn with matplotlib's object API (no display needed).
"""

from __future__ import annotations

import re
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch

from common.files import save_figure
from interp.graph import EMBEDDINGS, LOGITS, mlp_name
from interp.scores import head_name

KIND_COLOURS = {
    "q": "#1f77b4",
    "k": "#ff7f0e",
    "v": "#2ca02c",
    "mlp": "#9467bd",
    "logits": "#b2182b",
}
KIND_NAMES = {
    "q": "through its queries (Q)",
    "k": "through its keys (K)",
    "v": "through its values (V)",
    "mlp": "into an MLP",
    "logits": "writes the answer",
}
ROLE_COLOURS = {"previous-token": "#9467bd", "induction": "#d62728", "duplicate-token": "#8c564b"}
# arrows of one pair of nodes bend apart
CURVES = {"q": -0.25, "k": 0.0, "v": 0.25, "mlp": 0.15, "logits": 0.0}
ROW = 1.6  # the distance between layers, in the units of the distance between heads


def positions(n_layer: int, n_head: int, spread: float) -> dict[str, tuple[float, float]]:
    """Where each head, each MLP, the embeddings and the logits sit: x across a layer's heads (an
    MLP right of them, half a row up), y the layer."""
    where = {
        head_name(layer, head): (head * spread, ROW * (layer + 1))
        for layer in range(n_layer)
        for head in range(n_head)
    }
    for layer in range(n_layer):
        where[mlp_name(layer)] = (n_head * spread, ROW * (layer + 1.5))
    middle = (n_head - 1) * spread / 2
    where[EMBEDDINGS] = (middle, 0.0)
    where[LOGITS] = (middle, ROW * (n_layer + 1))
    return where


def arrow(
    ax, start, end, colour: str, width: float, bend: float, label: str, alpha: float = 0.85
) -> None:
    """An arrow from start to end bent by `bend` (matplotlib's arc3), its label (if any) on the
    curve (the labels of a pair's Q, K and V arrows at different heights)."""
    style = {"arrowstyle": "-|>", "mutation_scale": 12, "shrinkA": 14, "shrinkB": 14, "zorder": 2}
    bent = f"arc3,rad={bend}"
    arrow = FancyArrowPatch(
        start, end, connectionstyle=bent, linewidth=width, color=colour, alpha=alpha, **style
    )
    ax.add_patch(arrow)
    if not label:
        return
    (x1, y1) = start
    (x2, y2) = end
    t = 0.5 + 0.6 * bend
    # as arc3 places it
    control = ((x1 + x2) / 2 + bend * (y2 - y1), (y1 + y2) / 2 - bend * (x2 - x1))
    x, y = (
        (1 - t) ** 2 * a + 2 * t * (1 - t) * c + t**2 * b for a, c, b in zip(start, control, end)
    )
    box = {"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.85}
    ax.text(x, y, label, fontsize=7, color=colour, ha="center", va="center", zorder=4, bbox=box)


METRIC_WORDS = {"task": "the task's metric", "kl": "minus the KL divergence"}
# where f has no interval (the JSON's "missing" says why: one row, or every resample alike)
NO_INTERVAL = "(no interval: see the JSON's missing)"


def bounds(found: dict, digits: int = 2) -> str:
    """f's interval as "[low, high]", or where there is none "(no interval: why)", why in short (the
    JSON's "missing" up to its first comma, colon or bracket: "one row")."""
    if "interval" in found:
        low, high = found["interval"]
        return f"[{low:.{digits}f}, {high:.{digits}f}]"
    why = found.get("missing", {}).get("interval")
    if why is None:
        return NO_INTERVAL
    short = re.split(r",|:| \(", why)[0]
    return f"(no interval: {short})"


MAX_ARROWS = 60  # the strongest kept edges a discovered circuit draws; the JSON has them all


def _figure(n_layer: int, n_head: int, columns: int, side: float, height: float):
    """The figure, the circuit's axes, the axes beside and where each node sits."""
    spread = 1.0 if n_head <= 8 else 12.0 / n_head
    width = max(5.0, 1.2 * columns * spread + 1.5)
    fig = Figure(figsize=(width + side, height + 1.8 * (n_layer + 1)), layout="constrained")
    ax, beside = fig.subplots(1, 2, width_ratios=[width, side])
    return fig, ax, beside, positions(n_layer, n_head, spread)


def _nodes(ax, where: dict, big: dict, small: list[str], size: int, boxed: bool) -> None:
    """Each of `small` a small grey dot, each of `big` ({name: (colour, label)}) a large one (an MLP
    a square) with its label under it, and the embeddings and the logits as boxes."""
    for name in small:
        if name not in big:
            ax.plot(*where[name], "s" if name.startswith("MLP") else "o", color="#d0d0d0",
                    markersize=6, zorder=1)  # fmt: skip
    box = {"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none"}
    for name, (colour, label) in big.items():
        x, y = where[name]
        ax.plot(
            x, y, "s" if name.startswith("MLP") else "o", color=colour, markersize=size, zorder=3
        )
        ax.text(x, y - (0.16 if boxed else 0.2), label, ha="center", va="top", fontsize=8,
                zorder=5, bbox=box if boxed else None)  # fmt: skip
    box = {"boxstyle": "round,pad=0.4", "facecolor": "#f2f2f2", "edgecolor": "#888888"}
    for name, text in ((EMBEDDINGS, "tokens (embeddings)"), (LOGITS, "answer (logits)")):
        ax.text(*where[name], text, ha="center", va="center", fontsize=9, zorder=4, bbox=box)


def _arrows(ax, where: dict, edges: list[dict], key: str, widths: tuple, label) -> None:
    """An arrow per edge, its width widths[0] + widths[1] |edge[key]| / the strongest's; label(edge,
    strongest) its (text, alpha)."""
    strongest = max([abs(e[key]) for e in edges] + [1e-9])
    for e in edges:
        width = widths[0] + widths[1] * abs(e[key]) / strongest
        text, alpha = label(e, strongest)
        colour = KIND_COLOURS[e["kind"]]
        ends = where[e["from"]], where[e["to"]]
        arrow(ax, *ends, colour, width, CURVES[e["kind"]], text, alpha)


def _path_label(edge: dict, strongest: float) -> tuple[str, float]:
    """--circuit's arrows: the kind and the effect, the embeddings' unlabelled and faint (the table
    beside has them)."""
    if edge["from"] == EMBEDDINGS:
        return "", 0.4
    kind = "" if edge["kind"] == LOGITS else edge["kind"].upper() + " "
    return f"{kind}{edge['effect']:+.2f}", 0.85


def _score_label(edge: dict, strongest: float) -> tuple[str, float]:
    """--discover's arrows: the score of those of a tenth of the strongest's or more."""
    return (f"{edge['score']:+.2f}" if abs(edge["score"]) >= 0.1 * strongest else ""), 0.85


def legend_text(circuit: dict, rows: int = 16) -> str:
    """How to read the picture, then its edges with their composition scores, strongest first."""
    base = circuit["composition_baseline"]
    lines = [
        "How to read it: bottom to top, as the residual",
        "stream flows. A big dot is a head that matters:",
        "corrupting its output alone moves the metric",
        "that fraction of the way to the corrupted run.",
        "An arrow: the later head reads what the earlier",
        "one wrote, through its queries (Q), keys (K) or",
        "values (V), or an MLP its input; its number, the",
        "effect of that path alone (path patching); into",
        "the answer: the node's direct effect.",
        "",
        f"edge, effect, composition (random {base['mean']:.2f} ± {base['std']:.2f}):",
    ]
    for edge in circuit["edges"][:rows]:
        score = f"{edge['composition']:.2f}" if "composition" in edge else "–"
        lines.append(
            f"{edge['from']:>10} → {edge['to']:<6} {edge['kind'].upper()} {edge['effect']:+.2f}  "
            f"{score}"
        )
    if len(circuit["edges"]) > rows:
        lines.append(f"... {len(circuit['edges']) - rows} more in circuit.json")
    lines += ["", "direct logit attribution of the answer writers:"]
    for node in circuit["nodes"]:
        dla = node.get("direct_logit_attribution")
        if abs(node["direct_effect"]) >= circuit["thresholds"]["edge"] and dla is not None:
            lines.append(f"{node['name']:>10}  {dla:+.2f} (effect {node['direct_effect']:+.2f})")
    f = circuit.get("faithfulness")
    if f:
        lines += [
            "",
            f"the whole: {f['size']} edges, faithfulness",
            f"{f['faithfulness']:.2f} {bounds(f)} ({f['ablation']} ablation)",
        ]
    return "\n".join(lines)


def layer_axes(ax, where: dict, n_layer: int) -> None:
    """The axes of a circuit's picture: every node in view, a label per layer, no frame."""
    xs = [x for x, _ in where.values()]
    ax.set(xlim=(min(xs) - 0.7, max(xs) + 0.7), ylim=(-0.5, ROW * (n_layer + 1) + 0.5))
    ax.set_yticks(
        [ROW * (layer + 1) for layer in range(n_layer)],
        [f"layer {layer}" for layer in range(n_layer)],
    )
    ax.tick_params(length=0)
    ax.set_xticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)


def plot_circuit(circuit: dict, n_layer: int, n_head: int, path: Path) -> None:
    """circuit.png: `circuit` as interp/task_circuit.py's find_circuit returns it."""
    fig, ax, side, where = _figure(n_layer, n_head, n_head, 4.6, 2.4)
    big = {}
    for node in circuit["nodes"]:
        role = f"\n{node['role']}" if node["role"] else ""
        colour = ROLE_COLOURS.get(node["role"], "#7f7f7f")
        big[node["name"]] = (colour, f"{node['name']}{role}\n{node['effect']:+.2f}")
    heads = [head_name(layer, head) for layer in range(n_layer) for head in range(n_head)]
    _nodes(ax, where, big, heads, 22, boxed=True)
    _arrows(ax, where, circuit["edges"], "effect", (0.8, 5), _path_label)
    layer_axes(ax, where, n_layer)
    side.axis("off")
    text = legend_text(circuit)
    side.text(0.0, 1.0, text, va="top", ha="left", fontsize=8, family="monospace",
              transform=side.transAxes)  # fmt: skip
    for kind, colour in KIND_COLOURS.items():
        if kind != "mlp" or any(n["head"] is None for n in circuit["nodes"]):
            side.plot([], [], color=colour, linewidth=3, label=KIND_NAMES[kind])
    side.legend(loc="lower left", fontsize=8, frameon=False, title="an arrow: the receiver reads")
    fig.suptitle(f"circuit: {circuit['task']}", fontsize=10)
    save_figure(fig, path, dpi=120)


def plot_discovered(found: dict, n_layer: int, n_head: int, mlp: bool, path: Path) -> None:
    """discovered.png: `found` as interp/discovery.py's discover returns it."""
    fig, ax, side, where = _figure(n_layer, n_head, n_head + mlp, 5.0, 2.6)
    kept = [e for e in found["edges"] if e["kept"]]
    used = {e["from"] for e in kept} | {e["to"] for e in kept}
    small = [n for n in where if n not in (EMBEDDINGS, LOGITS) and (mlp or n[:3] != "MLP")]
    _nodes(ax, where, {n: ("#7f7f7f", n) for n in small if n in used}, small, 14, boxed=False)
    _arrows(ax, where, kept[:MAX_ARROWS], "score", (0.6, 4.5), _score_label)
    layer_axes(ax, where, n_layer)
    for kind, colour in KIND_COLOURS.items():
        if kind != "mlp" or mlp:
            ax.plot([], [], color=colour, linewidth=3, label=KIND_NAMES[kind])
    ax.legend(loc="upper left", fontsize=8, frameon=False, title="an arrow", title_fontsize=8)
    _curve(side, found)
    fig.suptitle(
        f"{found['size']} edges, f = {found['faithfulness']:.2f} {bounds(found)} under "
        f"{found['ablation']} ablation ({METRIC_WORDS[found['metric']]})\n{found['task']}",
        fontsize=9,
    )
    save_figure(fig, path, dpi=120)


def _curve(ax, found: dict) -> None:
    """f of the strongest k edges against k / n, the share of the n edges kept, from 0 to 1 on a
    linear axis: the axis the printed area is taken over (interp/discovery.py's area)."""
    n = len(found["edges"])
    ks = [int(k) for k in found["curve"]]
    fs = list(found["curve"].values())
    ax.plot([k / n for k in ks], fs, "o-", color="#333333", markersize=3)
    ax.axhline(
        found["target"],
        color="#b2182b",
        linestyle="--",
        linewidth=1,
        label=f"target {found['target']}",
    )
    if found["reached"]:
        ax.axvline(
            found["prefix"] / n,
            color="#2166ac",
            linewidth=1,
            label=f"the strongest {found['prefix']}",
        )
    if max(fs) > 1:
        ax.axhline(1, color="#888888", linewidth=0.8, linestyle=":", label="f = 1, the whole model")
    ax.set(
        xlabel=f"share of the {n} edges kept (the strongest k / {n})",
        ylabel="faithfulness f",
        xlim=(0, 1),
        ylim=(min(-0.1, *fs), max(1.15, max(fs) + 0.05)),
    )
    ax.legend(fontsize=8, loc="lower right")
    title = f"area under the curve {found['area']:.3f}"
    if max(fs) > 1:
        title += "\n(above f = 1: those edges carry more than the model)"
    ax.set_title(title, fontsize=9)


# circuits_training.png: the scales of its curves. Scores and shares have a natural range and are
# drawn on it; a curve in nats spans at least MIN_NATS, so that a change of a tenth of a nat fills
# a tenth of its panel, not all of it (the one-layer control's in-context score moves 0.33 in all)
FIXED = {"scores": (0.0, 1.0), "faithfulness": (0.0, 1.1)}
MIN_NATS = 1.0


def _nats_scale(ax, values: list[float]) -> None:
    """The panel's y-axis: the values' range, widened about its middle to at least MIN_NATS."""
    low, high = min(values), max(values)
    middle = (low + high) / 2
    half = max(high - low, MIN_NATS) / 2 * 1.1
    ax.set_ylim(middle - half, middle + half)


def plot_circuits_training(found: dict, path: Path) -> None:
    """circuits_training.png: the loss, the role scores, K-composition, the in-context learning
    score, and what the final circuit carries (and its faithfulness, on its own axis) against
    iteration. Scores on 0 to 1, f on 0 to 1.1, nats over at least MIN_NATS; each curve's range
    in its label; a curve's steepest change shaded only where it is steep (STEEP, with the
    threshold's reasons, in interp/circuit_training.py)."""
    evals = found["evals"]
    its = [e["iter"] for e in evals]
    fig = Figure(figsize=(8.5, 8.0), layout="constrained")
    axes = fig.subplots(4, 1, sharex=True)
    panels = [
        (axes[0], "nats", [("val_loss", "val loss", "#333333")]),
        (axes[1], "scores", [("previous_token", "best previous-token score", "#9467bd"),
                             ("induction", "best induction score", "#d62728"),
                             ("k_composition", "strongest K-composition", "#ff7f0e")]),
        (axes[2], "nats", [("icl_score", "in-context learning score (nats)", "#2ca02c")]),
        (axes[3], "nats", [("carried", "what the final circuit carries (nats)", "#1f77b4")]),
        (axes[3].twinx(), "faithfulness", [("faithfulness", "its faithfulness f (right)",
                                            "#8c8c8c")]),
    ]  # fmt: skip
    for ax, scale, curves in panels:
        drawn = []
        for key, label, colour in curves:
            points = [(i, e[key]) for i, e in zip(its, evals) if e.get(key) is not None]
            if not points:
                continue
            values = [v for _, v in points]
            drawn += values
            label += f": {min(values):+.2f} to {max(values):+.2f}"
            change = found["phase_change"].get(key)
            if change and change.get("steep", True):
                ax.axvspan(change["from"], change["to"], color=colour, alpha=0.12)
                label += f", steepest {change['from']}-{change['to']} (shaded)"
            elif change:
                label += ", no steep change"
            ax.plot(*zip(*points), "o-", color=colour, markersize=3, label=label)
        if scale == "nats" and drawn:
            _nats_scale(ax, drawn)
        elif scale in FIXED:
            low, high = FIXED[scale]
            ax.set_ylim(min([low, *drawn]), max([high, *drawn]) + 0.02)
        ax.legend(fontsize=7, loc="best")
    base = next((e["k_baseline"] for e in evals if "k_baseline" in e), None)
    if base is not None:
        axes[1].axhline(base, color="#ff7f0e", linestyle=":", linewidth=1)
    panels[-1][0].legend(fontsize=7, loc="center right")
    axes[3].set_xlabel("iteration")
    fig.suptitle(
        f"circuits through training: {len(found['circuit'])} edges of the final circuit, "
        f"{found['ablation']} ablation\n{found['task']}",
        fontsize=9,
    )
    save_figure(fig, path, dpi=110)
